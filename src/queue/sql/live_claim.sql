-- live_claim: docs/design.md §2 claim liveness as SQL, a condition on claim row c: its deadline and
-- its lease, if any, lie ahead. Included (`-- @include live_claim.sql`, build.rs) by heartbeat.sql,
-- claim_waiting.sql,
-- complete_success.sql, complete_success_many.sql, end_live_claim.sql, output_fence.sql,
-- output_reader_holds.sql and
-- (negated) find_expired_claims.sql; its Rust side is
-- queue::eligibility::claim_is_live.
c.deadline > now() AND (c.lease_expires_at IS NULL OR c.lease_expires_at > now())
