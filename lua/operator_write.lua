-- operator_write: records who gave an operator's command on a breaker, and why, stamped with
-- the server's time; or forgets the record (a command given without an operator replaces the
-- record of an earlier one). Written before the command runs, so every process that learns of
-- the change finds it. See `coordinator/operators.rs`.
--
-- KEYS[1]  operator records hash `caracal:v1:{<namespace>}:operators`: field -> JSON record
-- ARGV     1 the field (`circuit_breaker:<identity tag>`), 2 the record as a JSON object
--          without its time (`{"who", "reason", "state"}`), '' to remove it
-- Reply    the time stored (ms since the epoch), 0 when removed
-- TTL      none: one small field per breaker an operator commanded, replaced by the next.
-- Cost     O(1).
local records, field = KEYS[1], ARGV[1]
if ARGV[2] == '' then
  redis.call('HDEL', records, field)
  return 0
end
local clock = redis.call('TIME')
local at = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local record = cjson.decode(ARGV[2])
record.at = at
redis.call('HSET', records, field, cjson.encode(record))
return at
