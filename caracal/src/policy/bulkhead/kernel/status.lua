-- bulkhead_status: a bulkhead's live state, for `caracal status`, on server time.
--
-- KEYS[1]  the lease set `caracal:v1:{<identity>}:leases`
-- ARGV     none
-- Reply    {now_ms, leases held (deadline after now)}
-- TTL      reads only.
-- Cost     O(log N) for N leases.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
return {now, redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')}
