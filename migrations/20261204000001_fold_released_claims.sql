-- released_claims is folded into work_order_attempts (issue #13): every claim the reaper or a
-- retirement released is already an attempt row ('reclaimed' or 'released'), written by the same
-- statement, so a late holder's "reclaimed" answer reads it there. Releases recorded before the
-- attempt history existed are carried over (their start is unknown: the release time stands in).
INSERT INTO work_order_attempts (claim_id, work_order_id, agent_id, started_at, ended_at, ended)
SELECT claim_id, work_order_id, agent_id, released_at, released_at, 'reclaimed'
FROM released_claims
ON CONFLICT (claim_id) DO NOTHING;

DROP TABLE released_claims;
