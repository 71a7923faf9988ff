-- bulkhead_status: a bulkhead's live state, for `caracal status`, on server time.
--
-- KEYS[1]  the lease set `caracal:v1:{<identity>}:leases`
-- KEYS[2]  an adaptive limit's estimate `caracal:v1:{<identity>}:adaptive` (adaptive.lua)
-- ARGV     none
-- Reply    {now_ms, leases held (deadline after now), the adaptive limit in thousandths, the
--          mean latency it came from and the base latency in µs (each 0 without an estimate)}
-- TTL      reads only.
-- Cost     O(log N) for N leases.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local estimate = redis.call('HMGET', KEYS[2], 'limit', 'latency', 'base')
return {now, redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf'),
  tonumber(estimate[1]) or 0, tonumber(estimate[2]) or 0, tonumber(estimate[3]) or 0}
