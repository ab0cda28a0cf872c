-- refusal_finished: who ended a finished order, and its last claim (agent, claim id).
-- $1 order id (uuid)
SELECT ended_by, claimed_by, claim_id FROM work_order_log WHERE id = $1
