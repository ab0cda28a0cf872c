-- requeue_reclaimed: orders whose claims release_expired_claims.sql released become PENDING
-- again, one more reclaim counted (retry_count unchanged, docs/design.md §2).
-- $1 order ids (uuid[])
UPDATE work_orders SET status = 'PENDING', reclaim_count = reclaim_count + 1, updated_at = now()
WHERE id = ANY ($1)
