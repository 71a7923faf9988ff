-- A window's totals, for `caracal status`, on server time.
--
-- KEYS[1]  the window hash `caracal:v1:{<identity>}:window` (see window.lua)
-- ARGV     none
-- Reply    {now_ms, deposits, withdrawals}: the sums of every stored bucket (a bucket past the
--          window stays stored until the next count drops it), 0 when the window is absent.
-- TTL      reads only.
-- Cost     O(buckets).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local stored = redis.call('HVALS', KEYS[1])
local deposits, withdrawals = 0, 0
for _, value in ipairs(stored) do
  local sep = string.find(value, ':', 1, true)
  deposits = deposits + tonumber(string.sub(value, 1, sep - 1))
  withdrawals = withdrawals + tonumber(string.sub(value, sep + 1))
end
return {now, deposits, withdrawals}
