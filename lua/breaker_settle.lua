-- breaker_settle: the result of a probe. A failure re-opens the breaker, enough successes
-- close it, an ignored outcome only frees the slot; a probe whose lease has passed, or that a
-- newer generation superseded, is stale and changes nothing. The same steps as
-- `Store::settle` in the Rust kernel. It never writes a state that does not exist, so an
-- out-of-band deletion cannot leave a half-written state behind.
--
-- KEYS[1]  state hash    `caracal:v1:{<identity>}:brk:state`
-- KEYS[2]  window list   `caracal:v1:{<identity>}:brk:window`
-- KEYS[3]  probe set     `caracal:v1:{<identity>}:brk:probes`
-- ARGV     1 pub/sub channel for transitions ('' for none), 2 identity tag for its messages,
--          3 minimum_throughput, 4 threshold (thousandths), 5 window_size, 6 window ms,
--          7 open ms, 8 half_open_probes, 9 half_open_successes, 10 probe lease ms,
--          11 probe token, 12 outcome ('s', 'f' or 'i'), 13 expected generation
-- Reply    {kind, phase, generation, successes}: kind 0 stale, 1 released (ignored), 2 counted
--          (a success short of closing), 3 closed (new generation), 4 re-opened (new
--          generation)
-- TTL      closed: the state expires at closed_until = now + max(window, 2 x open). Open and
--          half-open: persisted. The probe set is deleted whenever the generation changes.
-- Cost     O(log P).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local state_key, window_key, probes_key = KEYS[1], KEYS[2], KEYS[3]

local fields = redis.call('HMGET', state_key, 'phase', 'generation', 'closed_until', 'successes')
local phase = tonumber(fields[1])
local generation = tonumber(fields[2])
if phase == nil or (phase == 0 and tonumber(fields[3]) <= now) then
  return {0, 0, 0, 0}
end
local deadline = tonumber(redis.call('ZSCORE', probes_key, ARGV[11]))
if deadline then
  redis.call('ZREM', probes_key, ARGV[11])
end
if not deadline or deadline <= now or phase ~= 2 or generation ~= tonumber(ARGV[13]) then
  return {0, phase, generation, 0}
end

local outcome = ARGV[12]
if outcome == 'i' then
  return {1, 2, generation, 0}
end
if outcome == 'f' then
  generation = generation + 1
  redis.call('HSET', state_key, 'phase', 1, 'generation', generation, 'opened_at', now, 'successes', 0)
  redis.call('DEL', probes_key)
  if ARGV[1] ~= '' then
    redis.call('PUBLISH', ARGV[1], ARGV[2] .. ':1:' .. generation)
  end
  return {4, 1, generation, 0}
end
local successes = tonumber(fields[4]) + 1
if successes < tonumber(ARGV[9]) then
  redis.call('HSET', state_key, 'successes', successes)
  return {2, 2, generation, successes}
end
generation = generation + 1
local closed_until = now + math.max(tonumber(ARGV[6]), 2 * tonumber(ARGV[7]))
redis.call('HSET', state_key, 'phase', 0, 'generation', generation, 'opened_at', 0,
  'successes', 0, 'total', 0, 'failures', 0, 'closed_until', closed_until)
redis.call('PEXPIREAT', state_key, closed_until)
redis.call('DEL', probes_key, window_key)
if ARGV[1] ~= '' then
  redis.call('PUBLISH', ARGV[1], ARGV[2] .. ':0:' .. generation)
end
return {3, 0, generation, 0}
