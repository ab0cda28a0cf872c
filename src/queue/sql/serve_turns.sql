-- serve_turns (a fragment, not a statement): the `served` CTE of the claims that keep tenant
-- turns (turn_walk.sql, claim_by_id.sql): the tenants of the orders in `target` (its column
-- tenant_key) were served now (docs/design.md §3), so their turns move to the back. A turn
-- already at the back (the last in the walk's order, served_at then tenant_key: the turns one
-- statement created share their time) stays as it is: with one tenant (the common case) no claim writes its
-- turn at all, where rewriting one row at every claim piled up dead versions and index entries
-- that every claim then walked. A turn another claim in flight holds is skipped, not awaited:
-- that claim is moving it to about the same time, and waiting would make every claim of one
-- tenant wait for the commit of the one before; under concurrency the order of turns is thus
-- approximate. Matched by ctid: a turn updated and committed since this statement's snapshot is
-- locked in its newest version, whose ctid the snapshot does not see, so that update is skipped
-- too. Lock order: the turn is taken last, after the order and the claim, and never awaited. A
-- parked turn (served_at 'infinity', the migration parked_turns) whose order was claimed (one
-- stranded there, or claimed by id) moves to the back like any other. The back is the latest
-- service of any turn, a parked one's included (last_served_at): a turn that stayed put while a
-- later-served one was parked would be behind it when that one comes back.
served AS (
  UPDATE tenant_turns t SET served_at = statement_timestamp()
  FROM (SELECT DISTINCT tenant_key FROM target) u
  CROSS JOIN LATERAL (
    SELECT x.ctid FROM tenant_turns x
    WHERE x.tenant_key = u.tenant_key
      AND (x.served_at = 'infinity'
           OR (x.served_at, x.tenant_key) < (SELECT m.served_at, m.tenant_key FROM tenant_turns m
                                             WHERE m.served_at < 'infinity'
                                             ORDER BY m.served_at DESC, m.tenant_key DESC
                                             LIMIT 1)
           OR x.served_at < (SELECT max(p.last_served_at) FROM tenant_turns p
                             WHERE p.served_at = 'infinity'))
    FOR NO KEY UPDATE SKIP LOCKED
  ) turn
  WHERE t.ctid = turn.ctid
),
