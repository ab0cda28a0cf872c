-- insert_agent: registers an agent (docs/design.md §5 POST /agents). A live agent of the same name
-- violates agents_live_name.
-- $1 id (uuid), $2 name (text), $3 labels (text[]), $4 annotations (jsonb),
-- $5 the annotations as key=value pairs (text[], queue::eligibility::annotation_pairs),
-- $6 work types (text[], empty = all), $7 tenant (text, NULL = instance-wide),
-- $8 max_concurrency (int, NULL = unlimited), $9 lease seconds (int, NULL = none recorded)
INSERT INTO agents (id, name, labels, annotations, annotation_pairs, work_types, tenant,
                    max_concurrency, lease_seconds)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
