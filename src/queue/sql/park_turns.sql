-- park_turns: parks the turns of the tenants a claim named idle (claim_next_result.sql
-- `idle_turns`) that have no PENDING or RETRY_PENDING order, looked at under each tenant's lock
-- (docs/design.md §3 "Parked turns"; pullman_park_turns, the migration parked_turns). Run after
-- the claim's commit, outside any transaction.
-- $1 the tenants' keys (uuid[])
-- Returns how many turns it parked.
SELECT pullman_park_turns($1::uuid[]) AS parked
