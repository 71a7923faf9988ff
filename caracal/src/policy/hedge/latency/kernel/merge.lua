-- A process's latency samples merged into the fleet's two rotating windows, and the merged
-- recent histogram answered. Same step as `Merge` in the Rust kernel beside this file (mod.rs).
--
-- KEYS[1]  `caracal:v1:{<identity>}:latency:0`: a hash, the window of an even epoch:
--          `epoch` -> the window it holds (server ms / width), `<bucket>` -> its count.
-- KEYS[2]  `caracal:v1:{<identity>}:latency:1`: the same, for an odd epoch.
-- ARGV[1]  a window's width in milliseconds (integer >= 1)
-- ARGV[2]  the histogram's bucket count (integer >= 1)
-- ARGV[3..] pairs: a bucket (integer, below ARGV[2]), the samples to add to it (integer >= 1)
-- Reply    the count of every bucket, ARGV[2] integers: the current window's and the previous
--          one's (a slot holding an older window counts for nothing).
-- TTL      PEXPIREAT the end of the window after the current one, on the current window's key,
--          set when samples are added: past it that window is no longer the previous one.
-- Cost     O(buckets): at most one DEL, HGETALL and HINCRBY per bucket on each key.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local width = tonumber(ARGV[1])
local buckets = tonumber(ARGV[2])
local epoch = math.floor(now / width)
local current = KEYS[1 + epoch % 2]
local previous = KEYS[1 + (epoch + 1) % 2]

if #ARGV > 2 then
  if tonumber(redis.call('HGET', current, 'epoch')) ~= epoch then
    redis.call('DEL', current)
    redis.call('HSET', current, 'epoch', string.format('%d', epoch))
  end
  for i = 3, #ARGV, 2 do
    redis.call('HINCRBY', current, ARGV[i], ARGV[i + 1])
  end
  redis.call('PEXPIREAT', current, string.format('%d', (epoch + 2) * width))
end

local counts = {}
for i = 1, buckets do
  counts[i] = 0
end
local function add(key, window)
  local stored = redis.call('HGETALL', key)
  local fields = {}
  for i = 1, #stored, 2 do
    fields[stored[i]] = tonumber(stored[i + 1])
  end
  if fields['epoch'] ~= window then
    return
  end
  for field, count in pairs(fields) do
    if field ~= 'epoch' then
      local bucket = tonumber(field) + 1
      counts[bucket] = counts[bucket] + count
    end
  end
end
add(current, epoch)
add(previous, epoch - 1)
return counts
