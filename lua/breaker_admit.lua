-- breaker_admit: may a call run? Closed: yes, as an ordinary observation. Open: no, until the
-- open time has elapsed; then the breaker turns half-open and the call becomes a probe. Half-open:
-- a probe if a probe slot is free. The same steps as `Store::admit` in the Rust kernel.
--
-- KEYS[1]  state hash    `caracal:v1:{<identity>}:brk:state`
-- KEYS[2]  window list   `caracal:v1:{<identity>}:brk:window`
-- KEYS[3]  probe set     `caracal:v1:{<identity>}:brk:probes` (token -> lease deadline, ms)
-- ARGV     1 pub/sub channel for transitions ('' for none), 2 identity tag for its messages,
--          3 minimum_throughput, 4 threshold (thousandths), 5 window_size, 6 window ms,
--          7 open ms, 8 half_open_probes, 9 half_open_successes, 10 probe lease ms,
--          11 probe token
-- Reply    {kind, generation, retry_after_ms, transitioned}: kind 0 closed (admit, no probe),
--          1 open (reject; retry_after_ms until a probe is possible), 2 probe limit (reject),
--          3 probe (admitted holding a slot; transitioned = 1 when this call turned the
--          breaker half-open)
-- TTL      reads only, except when a probe is taken: the state is persisted (half-open never
--          expires) and the probe set expires 1 s after its latest deadline.
-- Cost     O(log P + E): P live probes, E expired ones pruned.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local state_key, probes_key = KEYS[1], KEYS[3]

local fields = redis.call('HMGET', state_key, 'phase', 'generation', 'opened_at', 'closed_until')
local phase = tonumber(fields[1])
local generation = tonumber(fields[2]) or 0
if phase == nil or (phase == 0 and tonumber(fields[4]) <= now) then
  return {0, 0, 0, 0}
end
if phase == 0 then
  return {0, generation, 0, 0}
end

local transitioned = 0
if phase == 1 then
  local due = tonumber(fields[3]) + tonumber(ARGV[7])
  if now < due then
    return {1, generation, due - now, 0}
  end
  redis.call('HSET', state_key, 'phase', 2, 'successes', 0)
  redis.call('DEL', probes_key)
  transitioned = 1
  if ARGV[1] ~= '' then
    redis.call('PUBLISH', ARGV[1], ARGV[2] .. ':2:' .. generation)
  end
else
  redis.call('ZREMRANGEBYSCORE', probes_key, '-inf', now)
end

if redis.call('ZCARD', probes_key) >= tonumber(ARGV[8]) then
  return {2, generation, 0, transitioned}
end
local deadline = now + tonumber(ARGV[10])
redis.call('ZADD', probes_key, deadline, ARGV[11])
local latest = redis.call('ZRANGE', probes_key, 0, 0, 'REV', 'WITHSCORES')
redis.call('PEXPIREAT', probes_key, math.max(deadline, tonumber(latest[2])) + 1000)
redis.call('PERSIST', state_key)
return {3, generation, 0, transitioned}
