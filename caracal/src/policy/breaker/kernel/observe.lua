-- breaker_observe: record a batch of outcomes of calls admitted while closed under one
-- generation, and open the breaker when the window crosses a threshold (failures, or slow calls
-- when there is a slow-call threshold). The same steps as `Store::observe` in the Rust kernel
-- (caracal/src/kernel/breaker.rs).
-- Sent after breaker_prelude.lua, whose locals it uses: now, stamp, the keys, publish and
-- settings.
--
-- KEYS[1]  state hash    `caracal:v1:{<identity>}:brk:state`
-- KEYS[2]  window list   `caracal:v1:{<identity>}:brk:window`: entries "<at ms>:<outcomes>",
--          one letter per observation (s success, f failure, w slow success, x slow failure),
--          oldest first
-- KEYS[3]  probe set     `caracal:v1:{<identity>}:brk:probes`
-- ARGV     1 pub/sub channel for transitions ('' for none), 2 message prefix
--          ("<process>:<origin>:<identity tag>"), 3 minimum_throughput, 4 failure threshold
--          (thousandths), 5 slow-call threshold (thousandths, 0 for none), 6 window_size,
--          7 window ms, 8 open ms, 9 half_open_probes, 10 half_open_successes,
--          11 probe lease ms, 12 expected generation, 13 outcomes (letters, oldest first),
--          14 generation to mint if the state was lost while window data survived
-- Reply    {kind, phase, generation, total, failures, slow, stamp}: kind 0 stale (dropped; phase and
--          generation are the current ones), 1 recorded, 2 opened (generation is the new one;
--          the counts are the window that opened it)
-- TTL      closed: the state expires at closed_until = now + max(window, 2 x open), refreshed on
--          every record (never before the window it governs); the window list expires with it,
--          so the totals in the state never count entries the list has lost (entries leave by
--          their own times, popped here; an entry stamped after now, server time that stepped
--          back, leaves when it reaches the head). Open: the state is persisted (an absent
--          state reads as closed).
-- Cost     O(1) amortised: every observation is pushed once and popped once; the window is
--          never scanned (totals live in the state).
local config = settings()
local window_ms, closed_ttl = config.window_ms, config.closed_ttl

-- How many observations, failures and slow calls `outcomes` holds.
local function count(outcomes)
  return #outcomes, select(2, string.gsub(outcomes, '[fx]', '')),
    select(2, string.gsub(outcomes, '[wx]', ''))
end

-- Pops the entries that aged out, and with `ahead` those stamped after now; returns what they
-- counted.
local function expire_window(ahead)
  local gone, gone_failures, gone_slow = 0, 0, 0
  while true do
    local entry = redis.call('LINDEX', window_key, 0)
    if not entry then break end
    local sep = string.find(entry, ':', 1, true)
    local at = tonumber(string.sub(entry, 1, sep - 1))
    if at + window_ms > now and not (ahead and at > now) then break end
    redis.call('LPOP', window_key)
    local n, f, s = count(string.sub(entry, sep + 1))
    gone, gone_failures, gone_slow = gone + n, gone_failures + f, gone_slow + s
  end
  return gone, gone_failures, gone_slow
end

local fields = redis.call('HMGET', state_key, 'phase', 'generation', 'closed_until', 'total',
  'failures', 'slow')
local phase = tonumber(fields[1])
local generation = tonumber(fields[2])
local total, failures, slow = tonumber(fields[4]), tonumber(fields[5]), tonumber(fields[6]) or 0
if phase == nil or (phase == 0 and tonumber(fields[3]) <= now) then
  -- The state is gone: window data that survived it belongs to a lost epoch (data stamped
  -- after now too: its results may still come).
  expire_window(false)
  generation = 0
  if redis.call('LLEN', window_key) > 0 then
    generation = tonumber(ARGV[14])
  end
  redis.call('DEL', window_key, probes_key)
  phase, total, failures, slow = 0, 0, 0, 0
  redis.call('HSET', state_key, 'phase', 0, 'generation', generation, 'opened_at', 0,
    'successes', 0, 'total', 0, 'failures', 0, 'slow', 0, 'closed_until', now + closed_ttl,
    'forced_until', 0)
  redis.call('PEXPIREAT', state_key, now + closed_ttl)
end
if phase ~= 0 or generation ~= tonumber(ARGV[12]) then
  return {0, phase, generation, 0, 0, 0, stamp}
end

-- Entries stamped after now were recorded before server time stepped back (a failover to a
-- replica whose clock is behind): at the head, they would hold every later entry in the window
-- until the clock caught up.
local gone, gone_failures, gone_slow = expire_window(true)
local outcomes = ARGV[13]
local n, f, s = count(outcomes)
total = total - gone + n
failures = failures - gone_failures + f
slow = slow - gone_slow + s
redis.call('RPUSH', window_key, now .. ':' .. outcomes)

local window_size = config.window_size
while total > window_size do
  local entry = redis.call('LINDEX', window_key, 0)
  local sep = string.find(entry, ':', 1, true)
  local held = string.sub(entry, sep + 1)
  local take = math.min(total - window_size, #held)
  local _, taken_failures, taken_slow = count(string.sub(held, 1, take))
  total, failures, slow = total - take, failures - taken_failures, slow - taken_slow
  if take == #held then
    redis.call('LPOP', window_key)
  else
    redis.call('LSET', window_key, 0, string.sub(entry, 1, sep) .. string.sub(held, take + 1))
  end
end

local function reached(counted, permille)
  return permille > 0 and counted * 1000 >= permille * total
end
if total >= config.minimum_throughput
    and (reached(failures, config.failure_threshold) or reached(slow, config.slow_threshold)) then
  generation = generation + 1
  redis.call('HSET', state_key, 'phase', 1, 'generation', generation, 'opened_at', now,
    'successes', 0, 'total', 0, 'failures', 0, 'slow', 0, 'closed_until', 0, 'forced_until', 0)
  redis.call('PERSIST', state_key)
  redis.call('DEL', window_key)
  publish(1, generation)
  return {2, 1, generation, total, failures, slow, stamp}
end
redis.call('HSET', state_key, 'total', total, 'failures', failures, 'slow', slow,
  'closed_until', now + closed_ttl)
redis.call('PEXPIREAT', state_key, now + closed_ttl)
redis.call('PEXPIREAT', window_key, now + closed_ttl)
return {1, 0, generation, total, failures, slow, stamp}
