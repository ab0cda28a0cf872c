-- Argo CD health check for pullman.dev/Executor (Lua 5.1, as Argo CD runs it in gopher-lua).
-- Reads the conditions of docs/design.md §6 (see docs/health.md):
--   Stalled=True -> Degraded    (invalid spec, agent name taken, token Secret not Pullman's, ...)
--   Ready=True   -> Healthy     (agent registered, token written, Deployment available if any)
--   otherwise    -> Progressing
-- Connected (whether the agent talks to the server right now) is deliberately left out, so an
-- agent that flaps does not turn the Application red; it is appended to the message instead.
local hs = { status = "Progressing", message = "Waiting for the Pullman controller to report on this Executor" }
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  return hs
end
local conditions = {}
for _, c in ipairs(obj.status.conditions) do
  conditions[c.type] = c
end
if conditions["Stalled"] ~= nil and conditions["Stalled"].status == "True" then
  hs.status = "Degraded"
  hs.message = conditions["Stalled"].message
elseif conditions["Ready"] ~= nil then
  if conditions["Ready"].status == "True" then
    hs.status = "Healthy"
  end
  hs.message = conditions["Ready"].message
end
if conditions["Connected"] ~= nil and conditions["Connected"].status ~= "True" then
  hs.message = hs.message .. " " .. conditions["Connected"].message
end
return hs
