-- breaker_observe: record a batch of outcomes of calls admitted while closed under one
-- generation, and open the breaker when the window crosses the threshold. The same steps as
-- `Store::observe` in the Rust kernel.
--
-- KEYS[1]  state hash    `caracal:v1:{<identity>}:brk:state`
-- KEYS[2]  window list   `caracal:v1:{<identity>}:brk:window`: entries "<at ms>:<outcomes>",
--          one 's' or 'f' per observation, oldest first
-- KEYS[3]  probe set     `caracal:v1:{<identity>}:brk:probes`
-- ARGV     1 pub/sub channel for transitions ('' for none), 2 identity tag for its messages,
--          3 minimum_throughput, 4 threshold (thousandths), 5 window_size, 6 window ms,
--          7 open ms, 8 half_open_probes, 9 half_open_successes, 10 probe lease ms,
--          11 expected generation, 12 outcomes ('s'/'f' string, oldest first),
--          13 generation to mint if the state was lost while window data survived
-- Reply    {kind, phase, generation, total, failures}: kind 0 stale (dropped; phase and
--          generation are the current ones), 1 recorded, 2 opened (generation is the new one;
--          total and failures are the window that opened it)
-- TTL      closed: the state expires at closed_until = now + max(window, 2 x open), refreshed on
--          every record (never before the window it governs); the window list expires with it,
--          so the totals in the state never count entries the list has lost (entries leave by
--          their own times, popped here). Open: the state is persisted (an absent state reads
--          as closed).
-- Cost     O(1) amortised: every observation is pushed once and popped once; the window is
--          never scanned (totals live in the state).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local state_key, window_key, probes_key = KEYS[1], KEYS[2], KEYS[3]
local window_ms = tonumber(ARGV[6])
local closed_ttl = math.max(window_ms, 2 * tonumber(ARGV[7]))

local function count_failures(outcomes)
  return select(2, string.gsub(outcomes, 'f', ''))
end

-- Pops the entries that aged out; returns how many observations and failures left.
local function expire_window()
  local gone, gone_failures = 0, 0
  while true do
    local entry = redis.call('LINDEX', window_key, 0)
    if not entry then break end
    local sep = string.find(entry, ':', 1, true)
    if tonumber(string.sub(entry, 1, sep - 1)) + window_ms > now then break end
    redis.call('LPOP', window_key)
    local outcomes = string.sub(entry, sep + 1)
    gone = gone + #outcomes
    gone_failures = gone_failures + count_failures(outcomes)
  end
  return gone, gone_failures
end

local fields = redis.call('HMGET', state_key, 'phase', 'generation', 'closed_until', 'total', 'failures')
local phase = tonumber(fields[1])
local generation = tonumber(fields[2])
local total, failures = tonumber(fields[4]), tonumber(fields[5])
if phase == nil or (phase == 0 and tonumber(fields[3]) <= now) then
  -- The state is gone: window data that survived it belongs to a lost epoch.
  expire_window()
  generation = 0
  if redis.call('LLEN', window_key) > 0 then
    generation = tonumber(ARGV[13])
  end
  redis.call('DEL', window_key, probes_key)
  phase, total, failures = 0, 0, 0
  redis.call('HSET', state_key, 'phase', 0, 'generation', generation, 'opened_at', 0,
    'successes', 0, 'total', 0, 'failures', 0, 'closed_until', now + closed_ttl)
  redis.call('PEXPIREAT', state_key, now + closed_ttl)
end
if phase ~= 0 or generation ~= tonumber(ARGV[11]) then
  return {0, phase, generation, 0, 0}
end

local gone, gone_failures = expire_window()
local outcomes = ARGV[12]
total = total - gone + #outcomes
failures = failures - gone_failures + count_failures(outcomes)
redis.call('RPUSH', window_key, now .. ':' .. outcomes)

local window_size = tonumber(ARGV[5])
while total > window_size do
  local entry = redis.call('LINDEX', window_key, 0)
  local sep = string.find(entry, ':', 1, true)
  local held = string.sub(entry, sep + 1)
  local take = math.min(total - window_size, #held)
  total = total - take
  failures = failures - count_failures(string.sub(held, 1, take))
  if take == #held then
    redis.call('LPOP', window_key)
  else
    redis.call('LSET', window_key, 0, string.sub(entry, 1, sep) .. string.sub(held, take + 1))
  end
end

if total >= tonumber(ARGV[3]) and failures * 1000 >= tonumber(ARGV[4]) * total then
  generation = generation + 1
  redis.call('HSET', state_key, 'phase', 1, 'generation', generation, 'opened_at', now,
    'successes', 0, 'total', 0, 'failures', 0, 'closed_until', 0)
  redis.call('PERSIST', state_key)
  redis.call('DEL', window_key)
  if ARGV[1] ~= '' then
    redis.call('PUBLISH', ARGV[1], ARGV[2] .. ':1:' .. generation)
  end
  return {2, 1, generation, total, failures}
end
redis.call('HSET', state_key, 'total', total, 'failures', failures, 'closed_until', now + closed_ttl)
redis.call('PEXPIREAT', state_key, now + closed_ttl)
redis.call('PEXPIREAT', window_key, now + closed_ttl)
return {1, 0, generation, total, failures}
