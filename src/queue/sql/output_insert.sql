-- output_insert: stores one chunk once (docs/design.md §9), adds its bytes to the order's totals and
-- wakes the order's followers (NOTIFY pullman_output, payload: the order id). Runs after
-- output_fence.sql in one transaction.
-- $1 order id (uuid)
-- $2 claim id (uuid)
-- $3 seq (bigint)
-- $4 gap bytes (bigint)
-- $5 bytes of the texts (bigint)
-- $6 streams (text[])
-- $7 texts (text[])
-- $8 times (timestamptz[])
-- $9 gap reason (text, NULL = not said)
-- Returns (line count, stored bytes of the order), or no row when this seq was stored before.
WITH ins AS (
  INSERT INTO work_order_output (work_order_id, claim_id, seq, attempt, gap_bytes, gap_reason,
                                 bytes, line_count, streams, texts, ats)
  VALUES ($1, $2, $3,
          -- attempts ended before this claim (work_order_attempts) + this one
          (SELECT count(*) + 1 FROM work_order_attempts WHERE work_order_id = $1)::integer,
          $4, $9, $5, cardinality($7::text[]), $6, $7, $8)
  ON CONFLICT (work_order_id, claim_id, seq) DO NOTHING
  RETURNING line_count, bytes
),
tot AS (
  UPDATE work_order_output_totals t SET stored_bytes = t.stored_bytes + ins.bytes
  FROM ins WHERE t.work_order_id = $1
  RETURNING t.stored_bytes
),
woke AS (SELECT pg_notify('pullman_output', $1::text) FROM ins)
SELECT ins.line_count, tot.stored_bytes FROM ins, tot, woke
