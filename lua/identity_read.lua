-- identity_read: the live state of one identity, for `caracal status`, on server time.
--
-- KEYS[1]  a bulkhead's lease set `caracal:v1:{<identity>}:leases`, or a breaker's state
--          hash `caracal:v1:{<identity>}:brk:state`
-- ARGV[1]  "bulkhead" or "breaker"
-- Reply    bulkhead: {now_ms, leases held (deadline after now)};
--          breaker: {now_ms, phase, generation, opened_at, total, failures, slow, closed_until,
--          forced_until}, each -1 when the state is absent
-- TTL      reads only.
-- Cost     O(log N) for N leases; O(1) for a breaker.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if ARGV[1] == 'bulkhead' then
  return {now, redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')}
end
local fields = redis.call('HMGET', KEYS[1], 'phase', 'generation', 'opened_at', 'total',
  'failures', 'slow', 'closed_until', 'forced_until')
local reply = {now}
for i = 1, 8 do
  reply[i + 1] = tonumber(fields[i]) or -1
end
return reply
