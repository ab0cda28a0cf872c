-- await_agent_statements: the second step of a retirement (queue::registry), after the one that
-- marked the agent retired has committed: locks the agent's row FOR UPDATE, which waits for
-- every claim and complete of the agent still in flight (they lock it FOR KEY SHARE,
-- claiming_agent.sql), so the claims they commit are there for release_agent_claims.sql, the
-- next statement. Claims that start now see the agent retired and take nothing.
-- $1 agent id (uuid)
SELECT id FROM agents WHERE id = $1 FOR UPDATE
