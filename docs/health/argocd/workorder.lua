-- Argo CD health check for pullman.dev/WorkOrder (Lua 5.1, as Argo CD runs it in gopher-lua).
-- Reads the conditions of docs/design.md §6 (see docs/health.md):
--   Ready=True                      -> Healthy     (the order succeeded)
--   Stalled=True or Completed=True  -> Degraded    (failed, rejected or cancelled)
--   anything else                   -> Progressing (not yet queued, pending, claimed, retrying)
-- A status the controller wrote for an older generation, or none at all, is Progressing.
local hs = { status = "Progressing", message = "Waiting for the Pullman controller to report on this WorkOrder" }
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
local function is_true(name)
  return conditions[name] ~= nil and conditions[name].status == "True"
end
if is_true("Ready") then
  hs.status = "Healthy"
  hs.message = conditions["Ready"].message
elseif is_true("Stalled") then
  hs.status = "Degraded"
  hs.message = conditions["Stalled"].message
elseif is_true("Completed") then
  hs.status = "Degraded"
  hs.message = conditions["Completed"].message
elseif conditions["Ready"] ~= nil then
  hs.message = conditions["Ready"].message
end
return hs
