-- overrides_write: sets or removes one fleet-wide override (`caracal config set|unset`), and
-- tells every process at once: the version moves on and is published on the namespace's feed.
-- Processes that miss the message see the new version on their next periodic check.
--
-- KEYS[1]  overrides hash `caracal:v1:{<namespace>}:overrides`: "<kind>.<name>.<key>" -> value
-- KEYS[2]  version `caracal:v1:{<namespace>}:overrides:version`: bumped on every change
-- ARGV     1 pub/sub channel ('' for none), 2 "set" or "unset", 3 the setting
--          ("<kind>.<name>.<key>"), 4 the value (set only, already validated by the caller)
-- Reply    {version, changed}: the version after the command, and 1 if it changed anything
-- TTL      none: overrides last until they are unset.
-- Cost     O(1).
local overrides, version_key = KEYS[1], KEYS[2]
local channel, command, setting = ARGV[1], ARGV[2], ARGV[3]
local changed = 0
if command == 'set' then
  if redis.call('HMGET', overrides, setting)[1] ~= ARGV[4] then
    redis.call('HSET', overrides, setting, ARGV[4])
    changed = 1
  end
else
  changed = redis.call('HDEL', overrides, setting)
end
local version = tonumber(redis.call('GET', version_key)) or 0
if changed == 1 then
  version = version + 1
  redis.call('SET', version_key, version)
  if channel ~= '' then
    redis.call('PUBLISH', channel, 'config:' .. version)
  end
end
return {version, changed}
