-- breaker_admit: may a call run? Closed: yes, as an ordinary observation. Open: no, until the
-- open time has elapsed; then the breaker turns half-open and the call becomes a probe. Half-open:
-- a probe if a probe slot is free. Forced open: no, until the operator's time lapses (then as
-- after an open time). Forced closed: yes, recording nothing, until the operator's time lapses
-- (then closed). The same steps as `Store::admit` in the Rust kernel
-- (caracal/src/kernel/breaker.rs).
-- Sent after breaker_prelude.lua, whose locals it uses: now, stamp, the keys, publish and
-- settings.
--
-- KEYS[1]  state hash    `caracal:v1:{<identity>}:brk:state`
-- KEYS[2]  window list   `caracal:v1:{<identity>}:brk:window`
-- KEYS[3]  probe set     `caracal:v1:{<identity>}:brk:probes` (token -> lease deadline, ms)
-- ARGV     1 pub/sub channel for transitions ('' for none), 2 message prefix
--          ("<process>:<origin>:<identity tag>"), 3 minimum_throughput, 4 failure threshold
--          (thousandths), 5 slow-call threshold (thousandths, 0 for none), 6 window_size,
--          7 window ms, 8 open ms, 9 half_open_probes, 10 half_open_successes,
--          11 probe lease ms, 12 probe token
-- Reply    {kind, generation, retry_after_ms, transitioned, stamp}: kind 0 closed (admit, no probe;
--          transitioned = 1 when this call ended a forced-closed period), 1 open (reject;
--          retry_after_ms until a probe is possible), 2 probe limit (reject), 3 probe
--          (admitted holding a slot; transitioned = 1 when this call turned the breaker
--          half-open), 4 forced open (reject; retry_after_ms until it lapses, 0 for "until a
--          reset"), 5 forced closed (admit, record nothing; retry_after_ms until it lapses, 0 for
--          "until a reset")
-- TTL      reads only, except on a transition and on an open time stored after now (server time
--          that stepped back, rewritten as now): half-open is persisted; a closed state after a
--          forced-closed period expires at closed_until = now + max(window, 2 x open); the
--          probe set expires 1 s after its latest deadline.
-- Cost     O(log P + E): P live probes, E expired ones pruned.
local config = settings()

local fields = redis.call('HMGET', state_key, 'phase', 'generation', 'opened_at', 'closed_until',
  'forced_until')
local phase = tonumber(fields[1])
local generation = tonumber(fields[2]) or 0
if phase == nil or (phase == 0 and tonumber(fields[4]) <= now) then
  return {0, 0, 0, 0, stamp}
end
if phase == 0 then
  return {0, generation, 0, 0, stamp}
end
local forced_until = tonumber(fields[5]) or 0
local lapsed = forced_until ~= 0 and forced_until <= now
if phase == 4 then
  if not lapsed then
    return {5, generation, forced_until == 0 and 0 or forced_until - now, 0, stamp}
  end
  local closed_until = now + config.closed_ttl
  redis.call('HSET', state_key, 'phase', 0, 'opened_at', 0, 'successes', 0, 'total', 0,
    'failures', 0, 'slow', 0, 'closed_until', closed_until, 'forced_until', 0)
  redis.call('PEXPIREAT', state_key, closed_until)
  publish(0, generation)
  return {0, generation, 0, 1, stamp}
end
if phase == 3 and not lapsed then
  return {4, generation, forced_until == 0 and 0 or forced_until - now, 0, stamp}
end

local transitioned = 0
if phase == 1 or phase == 3 then
  local opened_at = tonumber(fields[3]) or 0
  if opened_at > now then
    -- Server time stepped back (a failover to a replica whose clock is behind): the open time
    -- runs from now, not from when the clock catches up.
    opened_at = now
    redis.call('HSET', state_key, 'opened_at', now)
  end
  local due = opened_at + config.open_ms
  if phase == 1 and now < due then
    return {1, generation, due - now, 0, stamp}
  end
  redis.call('HSET', state_key, 'phase', 2, 'successes', 0, 'forced_until', 0)
  redis.call('DEL', probes_key)
  transitioned = 1
  publish(2, generation)
else
  redis.call('ZREMRANGEBYSCORE', probes_key, '-inf', now)
end

if redis.call('ZCARD', probes_key) >= config.half_open_probes then
  return {2, generation, 0, transitioned, stamp}
end
local deadline = now + config.probe_lease_ms
redis.call('ZADD', probes_key, deadline, ARGV[12])
local latest = redis.call('ZRANGE', probes_key, 0, 0, 'REV', 'WITHSCORES')
redis.call('PEXPIREAT', probes_key, math.max(deadline, tonumber(latest[2])) + 1000)
redis.call('PERSIST', state_key)
return {3, generation, 0, transitioned, stamp}
