-- An adaptive limit: a process's observations join the identity's open window, and once the
-- window has passed the limit is updated from it. Same step as `Adapt` in the Rust kernel
-- beside this file (adaptive.rs), whose module docs give the algorithm.
--
-- KEYS[1]  `caracal:v1:{<identity>}:adaptive`: a hash. `limit` (thousandths), `latency` and
--          `base` (µs), `since` (ms of server time), and the open window's `n`, `sum`, `low`,
--          `drops` and `peak`.
-- ARGV     samples, sum (µs), low (µs), drops, peak, min, initial, max, window (ms): integers.
-- Reply    {limit, latency, base}: the whole limit in force within [min, max], the mean latency
--          it was last updated from and the base (0: none yet).
-- TTL      PEXPIREAT now + 600 s (`IDLE_MS`) at every step.
-- Cost     O(1): one HMGET, one HSET, one PEXPIREAT.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local MAX_SUM = 9007199254740991
local IDLE_MS = 600000
local samples, sum, low = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local drops, peak = tonumber(ARGV[4]), tonumber(ARGV[5])
local min, initial, max = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local window = tonumber(ARGV[9])

local stored = redis.call('HMGET', KEYS[1],
  'limit', 'latency', 'base', 'since', 'n', 'sum', 'low', 'drops', 'peak')
local e = {}
for i = 1, 9 do
  e[i] = tonumber(stored[i]) or 0
end
local limit, latency, base, since = e[1], e[2], e[3], e[4]
local wn, wsum, wlow, wdrops, wpeak = e[5], e[6], e[7], e[8], e[9]
if limit == 0 then
  limit, latency, base, since = initial * 1000, 0, 0, now
  wn, wsum, wlow, wdrops, wpeak = 0, 0, 0, 0, 0
end
limit = math.min(math.max(limit, min * 1000), max * 1000)

if samples > 0 then
  if wn == 0 then wlow = low else wlow = math.min(wlow, low) end
end
wn = math.min(wn + samples, MAX_SUM)
wsum = math.min(wsum + sum, MAX_SUM)
wdrops = math.min(wdrops + drops, MAX_SUM)
wpeak = math.max(wpeak, peak)

if now >= since + window then
  if wn > 0 or wdrops > 0 then
    local target = limit
    if wn > 0 then
      local mean = math.max(math.floor(wsum / wn), 1)
      local least = math.max(wlow, 1)
      if base == 0 or least < base then
        base = least
      else
        base = base + math.floor((least - base) / 16)
      end
      latency = mean
      local gradient = math.min(math.floor(base * 1100 / mean), 1000)
      if gradient == 1000 then
        target = math.floor(limit * 1200 / 1000)
      else
        target = math.floor(limit * gradient / 1000)
      end
    end
    if wdrops * 1000 > (wn + wdrops) * 100 then
      target = math.min(target, math.floor(limit * 3 / 4))
    end
    if wpeak * 2 * 1000 < limit then
      target = math.min(target, limit)
    end
    target = math.max(target, math.floor(limit / 2))
    limit = math.min(math.max(math.floor((limit + target) / 2), min * 1000), max * 1000)
  end
  since = now
  wn, wsum, wlow, wdrops, wpeak = 0, 0, 0, 0, 0
end

local function int(n)
  return string.format('%d', n)
end
redis.call('HSET', KEYS[1], 'limit', int(limit), 'latency', int(latency), 'base', int(base),
  'since', int(since), 'n', int(wn), 'sum', int(wsum), 'low', int(wlow), 'drops', int(wdrops),
  'peak', int(wpeak))
redis.call('PEXPIREAT', KEYS[1], now + IDLE_MS)
local whole = math.min(math.max(math.floor(limit / 1000), min), max)
return {whole, latency, base}
