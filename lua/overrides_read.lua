-- overrides_read: the fleet-wide overrides, unless the caller already holds their version
-- (the periodic check every process makes costs one small reply).
--
-- KEYS[1]  overrides hash `caracal:v1:{<namespace>}:overrides`
-- KEYS[2]  version `caracal:v1:{<namespace>}:overrides:version`
-- ARGV[1]  the version the caller holds (-1 for none)
-- Reply    {version} when it is the caller's, else {version, setting, value, setting, value, …}
-- TTL      reads only.
-- Cost     O(1), or O(N) for N overrides when they changed.
local version = tonumber(redis.call('GET', KEYS[2])) or 0
if version == tonumber(ARGV[1]) then
  return {version}
end
local reply = {version}
for _, item in ipairs(redis.call('HGETALL', KEYS[1])) do
  reply[#reply + 1] = item
end
return reply
