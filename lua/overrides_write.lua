-- overrides_write: sets or removes one fleet-wide override (`caracal config set|unset`), and
-- tells every process at once: the version moves on and is published on the namespace's feed.
-- Processes that miss the message see the new version on their next periodic check. A change
-- also records its operator (see `coordinator/operators.rs`), stamped with the server's time:
-- the setting's record while it is set, and the record of the change that made the version;
-- a change without an operator removes both, so no earlier operator is named for it.
--
-- KEYS[1]  overrides hash `caracal:v1:{<namespace>}:overrides`: "<kind>.<name>.<key>" -> value
-- KEYS[2]  version `caracal:v1:{<namespace>}:overrides:version`: bumped on every change
-- KEYS[3]  operator records hash `caracal:v1:{<namespace>}:operators`: field -> JSON record
-- ARGV     1 pub/sub channel ('' for none), 2 "set" or "unset", 3 the setting
--          ("<kind>.<name>.<key>"), 4 the value (set only, already validated by the caller),
--          5 the operator as a JSON object `{"who", "reason"}` ('' for none)
-- Reply    {version, changed}: the version after the command, and 1 if it changed anything
-- TTL      none: overrides last until they are unset; so do their records.
-- Cost     O(1).
local overrides, version_key, records = KEYS[1], KEYS[2], KEYS[3]
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
  local field = 'override:' .. setting
  if ARGV[5] == '' then
    redis.call('HDEL', records, field, 'override')
  else
    local clock = redis.call('TIME')
    local record = cjson.decode(ARGV[5])
    record.at = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
    if command == 'set' then
      record.value = ARGV[4]
      redis.call('HSET', records, field, cjson.encode(record))
      record.value = nil
    else
      redis.call('HDEL', records, field)
    end
    record.setting, record.version = setting, version
    redis.call('HSET', records, 'override', cjson.encode(record))
  end
  if channel ~= '' then
    redis.call('PUBLISH', channel, 'config:' .. version)
  end
end
return {version, changed}
