-- A sliding window of deposits and withdrawals: counts added to the current bucket, buckets a
-- whole window old dropped, the totals answered. Same step as `Slide` in the Rust kernel beside
-- this file (mod.rs).
--
-- KEYS[1]  `caracal:v1:{<identity>}:window`: a hash, one field per bucket: its start in
--          milliseconds of server time (a multiple of the width) -> "<deposits>:<withdrawals>".
-- ARGV[1]  deposits to add (integer >= 0)
-- ARGV[2]  withdrawals to add (integer >= 0)
-- ARGV[3]  a bucket's width in milliseconds (integer >= 1)
-- ARGV[4]  buckets in a window (integer >= 1)
--          Buckets that start after now (server time that stepped back) are dropped too.
-- Reply    {deposits, withdrawals}: the window's totals after the step.
-- TTL      PEXPIREAT the end of the window of the current bucket, set when counts are added:
--          past it every bucket would be dropped.
-- Cost     O(buckets): HGETALL, at most one HDEL, HSET and PEXPIREAT.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local deposits, withdrawals = tonumber(ARGV[1]), tonumber(ARGV[2])
local width = tonumber(ARGV[3])
local current = now - now % width
local span = width * tonumber(ARGV[4])

local stored = redis.call('HGETALL', KEYS[1])
local expired = {}
local total_deposits, total_withdrawals = 0, 0
local here = nil
for i = 1, #stored, 2 do
  local start = tonumber(stored[i])
  local value = stored[i + 1]
  -- A bucket that starts after now was opened before server time stepped back (a failover to
  -- a replica whose clock is behind): kept, it would count until the clock caught up.
  if start <= now and start + span > current then
    local sep = string.find(value, ':', 1, true)
    local d, w = tonumber(string.sub(value, 1, sep - 1)), tonumber(string.sub(value, sep + 1))
    total_deposits = total_deposits + d
    total_withdrawals = total_withdrawals + w
    if start == current then
      here = {d, w}
    end
  else
    expired[#expired + 1] = stored[i]
  end
end
if #expired > 0 then
  redis.call('HDEL', KEYS[1], unpack(expired))
end

if deposits + withdrawals > 0 then
  local d, w = deposits, withdrawals
  if here then
    d, w = d + here[1], w + here[2]
  end
  redis.call('HSET', KEYS[1], string.format('%d', current), string.format('%d:%d', d, w))
  redis.call('PEXPIREAT', KEYS[1], current + span)
  total_deposits = total_deposits + deposits
  total_withdrawals = total_withdrawals + withdrawals
end
return {total_deposits, total_withdrawals}
