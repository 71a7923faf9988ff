-- breaker_prelude: not a script of its own. The breaker's kernel
-- (caracal/src/kernel/breaker/commands.rs) sends it in front of every breaker script
-- (breaker_admit, breaker_observe, breaker_settle, breaker_force), which then read the server's
-- clock, their keys, their transition messages and their settings from here, by name.
--
-- KEYS[1]  state hash    `caracal:v1:{<identity>}:brk:state`
-- KEYS[2]  window list   `caracal:v1:{<identity>}:brk:window`
-- KEYS[3]  probe set     `caracal:v1:{<identity>}:brk:probes`
-- ARGV     1 pub/sub channel for transitions ('' for none), 2 message prefix; `settings()`:
--          3 minimum_throughput, 4 failure threshold (thousandths), 5 slow-call threshold
--          (thousandths, 0 for none), 6 window_size, 7 window ms, 8 open ms, 9 half_open_probes,
--          10 half_open_successes, 11 probe lease ms (breaker_force has other arguments there,
--          and does not call it)
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
-- Where this decision falls in the server's order (microseconds): the last element of every
-- reply and of every message, so a process never lets an earlier decision undo a later one.
local stamp = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local stamp_text = clock[1] .. string.format('%06d', tonumber(clock[2]))
local state_key, window_key, probes_key = KEYS[1], KEYS[2], KEYS[3]

-- Tells the other processes that the breaker turned to `phase` under `generation`.
local function publish(phase, generation)
  if ARGV[1] ~= '' then
    redis.call('PUBLISH', ARGV[1], ARGV[2] .. ':' .. phase .. ':' .. generation .. ':' .. stamp_text)
  end
end

-- The breaker's settings, ARGV 3 to 11 of the admission, observation and settlement scripts.
local function settings()
  local window_ms, open_ms = tonumber(ARGV[7]), tonumber(ARGV[8])
  return {
    minimum_throughput = tonumber(ARGV[3]),
    failure_threshold = tonumber(ARGV[4]),
    slow_threshold = tonumber(ARGV[5]),
    window_size = tonumber(ARGV[6]),
    window_ms = window_ms,
    open_ms = open_ms,
    half_open_probes = tonumber(ARGV[9]),
    half_open_successes = tonumber(ARGV[10]),
    probe_lease_ms = tonumber(ARGV[11]),
    -- How long a closed state lasts without observations: never less than the window it
    -- governs, nor than two open times.
    closed_ttl = math.max(window_ms, 2 * open_ms),
  }
end
