-- breaker_settle: the result of a probe. A failure re-opens the breaker, enough successes
-- close it, an ignored outcome only frees the slot; a probe whose lease has passed, or that a
-- newer generation (or an operator) superseded, is stale and changes nothing. The same steps as
-- `Store::settle` in the Rust kernel (caracal/src/kernel/breaker.rs). It never writes a state
-- that does not exist, so an out-of-band deletion cannot leave a half-written state behind.
-- Sent after breaker_prelude.lua, whose locals it uses: now, stamp, the keys, publish and
-- settings.
--
-- KEYS[1]  state hash    `caracal:v1:{<identity>}:brk:state`
-- KEYS[2]  window list   `caracal:v1:{<identity>}:brk:window`
-- KEYS[3]  probe set     `caracal:v1:{<identity>}:brk:probes`
-- ARGV     1 pub/sub channel for transitions ('' for none), 2 message prefix
--          ("<process>:<origin>:<identity tag>"), 3 minimum_throughput, 4 failure threshold
--          (thousandths), 5 slow-call threshold (thousandths, 0 for none), 6 window_size,
--          7 window ms, 8 open ms, 9 half_open_probes, 10 half_open_successes,
--          11 probe lease ms, 12 probe token, 13 outcome ('s', 'f' or 'i'), 14 expected
--          generation
-- Reply    {kind, phase, generation, successes, stamp}: kind 0 stale, 1 released (ignored), 2 counted
--          (a success short of closing), 3 closed (new generation), 4 re-opened (new
--          generation)
-- TTL      closed: the state expires at closed_until = now + max(window, 2 x open). Open and
--          half-open: persisted. The probe set is deleted whenever the generation changes.
-- Cost     O(log P).
local config = settings()

local fields = redis.call('HMGET', state_key, 'phase', 'generation', 'closed_until', 'successes')
local phase = tonumber(fields[1])
local generation = tonumber(fields[2])
if phase == nil or (phase == 0 and tonumber(fields[3]) <= now) then
  return {0, 0, 0, 0, stamp}
end
local deadline = tonumber(redis.call('ZSCORE', probes_key, ARGV[12]))
if deadline then
  redis.call('ZREM', probes_key, ARGV[12])
end
if not deadline or deadline <= now or phase ~= 2 or generation ~= tonumber(ARGV[14]) then
  return {0, phase, generation, 0, stamp}
end

local outcome = ARGV[13]
if outcome == 'i' then
  return {1, 2, generation, 0, stamp}
end
if outcome == 'f' then
  generation = generation + 1
  redis.call('HSET', state_key, 'phase', 1, 'generation', generation, 'opened_at', now,
    'successes', 0)
  redis.call('DEL', probes_key)
  publish(1, generation)
  return {4, 1, generation, 0, stamp}
end
local successes = tonumber(fields[4]) + 1
if successes < config.half_open_successes then
  redis.call('HSET', state_key, 'successes', successes)
  return {2, 2, generation, successes, stamp}
end
generation = generation + 1
local closed_until = now + config.closed_ttl
redis.call('HSET', state_key, 'phase', 0, 'generation', generation, 'opened_at', 0,
  'successes', 0, 'total', 0, 'failures', 0, 'slow', 0, 'closed_until', closed_until,
  'forced_until', 0)
redis.call('PEXPIREAT', state_key, closed_until)
redis.call('DEL', probes_key, window_key)
publish(0, generation)
return {3, 0, generation, 0, stamp}
