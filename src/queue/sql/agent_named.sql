-- agent_named: the agent a name means where an agent may be named (docs/design.md §5: names are
-- unique among live agents only): the live agent of that name, else the newest retired one.
-- $1 name (text)
SELECT id FROM agents WHERE name = $1
ORDER BY (retired_at IS NULL) DESC, created_at DESC, id DESC
LIMIT 1
