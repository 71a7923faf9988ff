-- breaker_force: an operator's command. "open": reject every call until `until` (or a reset);
-- "closed": admit every call, recording nothing, until `until` (or a reset); "reset": closed
-- with an empty window. Each starts a new generation (results admitted before are stale) and
-- clears the window and the probes. The same steps as `Store::force` in the Rust kernel
-- (caracal/src/kernel/breaker.rs).
-- Sent after breaker_prelude.lua, whose locals it uses: now, stamp, the keys and publish.
--
-- KEYS[1]  state hash    `caracal:v1:{<identity>}:brk:state`
-- KEYS[2]  window list   `caracal:v1:{<identity>}:brk:window`
-- KEYS[3]  probe set     `caracal:v1:{<identity>}:brk:probes`
-- ARGV     1 pub/sub channel for transitions ('' for none), 2 message prefix
--          ("<process>:operator:<identity tag>"), 3 command ("open", "closed" or "reset"),
--          4 how long a forced state lasts (ms; 0 for "until a reset"), 5 how long the closed
--          state of a reset lasts without observations (ms)
-- Reply    {from_phase, generation, stamp}: the phase the command ended, and the new generation
-- TTL      forced states never expire; a reset's closed state expires at now + ARGV[5].
-- Cost     O(1).
local fields = redis.call('HMGET', state_key, 'phase', 'generation', 'closed_until')
local phase = tonumber(fields[1])
local generation = tonumber(fields[2]) or 0
if phase == nil or (phase == 0 and tonumber(fields[3]) <= now) then
  phase, generation = 0, 0
end
generation = generation + 1

local command, lasts = ARGV[3], tonumber(ARGV[4])
local until_ms = 0
if lasts > 0 then until_ms = now + lasts end
local new_phase, opened_at, closed_until, forced_until = 4, 0, 0, until_ms
if command == 'open' then
  new_phase, opened_at = 3, now
elseif command == 'reset' then
  new_phase, closed_until, forced_until = 0, now + tonumber(ARGV[5]), 0
end
redis.call('HSET', state_key, 'phase', new_phase, 'generation', generation,
  'opened_at', opened_at, 'successes', 0, 'total', 0, 'failures', 0, 'slow', 0,
  'closed_until', closed_until, 'forced_until', forced_until)
if new_phase == 0 then
  redis.call('PEXPIREAT', state_key, closed_until)
else
  redis.call('PERSIST', state_key)
end
redis.call('DEL', window_key, probes_key)
publish(new_phase, generation)
return {phase, generation, stamp}
