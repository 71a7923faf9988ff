-- breaker_status: a circuit breaker's live state, for `caracal status`, on server time.
--
-- KEYS[1]  the state hash `caracal:v1:{<identity>}:brk:state`
-- ARGV     none
-- Reply    {now_ms, phase, generation, opened_at, total, failures, slow, closed_until,
--          forced_until}, each -1 when the state is absent
-- TTL      reads only.
-- Cost     O(1).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local fields = redis.call('HMGET', KEYS[1], 'phase', 'generation', 'opened_at', 'total',
  'failures', 'slow', 'closed_until', 'forced_until')
local reply = {now}
for i = 1, 8 do
  reply[i + 1] = tonumber(fields[i]) or -1
end
return reply
