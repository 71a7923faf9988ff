-- overrides_read: the fleet-wide overrides, unless the caller already holds their version
-- (the periodic check every process makes costs one small reply); and the namespace's marker,
-- which a flush of the server's keys removes: a process that finds another marker than the
-- one it read before knows the server lost its data without restarting.
--
-- KEYS[1]  overrides hash `caracal:v1:{<namespace>}:overrides`
-- KEYS[2]  version `caracal:v1:{<namespace>}:overrides:version`
-- KEYS[3]  marker `caracal:v1:{<namespace>}:marker`: a random string, set by the first reader
-- KEYS[4]  operator records hash `caracal:v1:{<namespace>}:operators`: its field `override` is
--          the record of the change that made the version (see `coordinator/operators.rs`)
-- ARGV[1]  the version the caller holds (-1 for none)
-- ARGV[2]  the marker to set when there is none (a fresh random string from the caller)
-- Reply    {version, marker} when the version is the caller's, else
--          {version, marker, record, setting, value, setting, value, …}, the record '' when
--          there is none
-- TTL      the marker never expires (one small key per namespace): it must outlive every lease.
-- Cost     O(1), or O(N) for N overrides when they changed.
local version = tonumber(redis.call('GET', KEYS[2])) or 0
local marker = redis.call('GET', KEYS[3])
if not marker then
  marker = ARGV[2]
  redis.call('SET', KEYS[3], marker)
end
if version == tonumber(ARGV[1]) then
  return {version, marker}
end
local reply = {version, marker, redis.call('HMGET', KEYS[4], 'override')[1] or ''}
for _, item in ipairs(redis.call('HGETALL', KEYS[1])) do
  reply[#reply + 1] = item
end
return reply
