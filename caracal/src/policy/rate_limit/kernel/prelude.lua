-- rate_prelude: not a script of its own. The rate limit's kernels (mod.rs and give_back.rs
-- beside this file) send it in front of their scripts (admit.lua, give_back.lua), which then read
-- the server's clock, the stored TAT and the helpers below from here, by name.
--
-- KEYS[1]  `caracal:v1:{<identity>}:rate:ns`: the theoretical arrival time (TAT) as
--          "<seconds>:<nanoseconds>" of server time. Time is kept as a (seconds, nanoseconds)
--          pair so every sum stays an exact integer in Lua's doubles (while interval x burst
--          stays under 2^53 ns, about 104 days; beyond, rounding errs by nanoseconds); the
--          interval is whole nanoseconds, rounded up from 1/rate, so rounding never admits
--          more than asked (@gkoos/caracal rounds to whole milliseconds: 700/s becomes 1000/s).
local clock = redis.call('TIME')
local now_s, now_ns = tonumber(clock[1]), tonumber(clock[2]) * 1000

-- The stored TAT, or nil (no key).
local stored_s, stored_ns
local stored = redis.call('GET', KEYS[1])
if stored then
  local sep = string.find(stored, ':', 1, true)
  stored_s, stored_ns = tonumber(string.sub(stored, 1, sep - 1)), tonumber(string.sub(stored, sep + 1))
end

-- A time moved by `by` nanoseconds (negative: back).
local function shifted(s, ns, by)
  local total = ns + by
  local rest = total % 1000000000
  return s + (total - rest) / 1000000000, rest
end

-- How far (ns) the time (s, ns) is ahead of now (negative: behind).
local function ahead_of_now(s, ns)
  return (s - now_s) * 1000000000 + (ns - now_ns)
end

-- Stores the TAT (s, ns), expiring at it (PXAT, rounded up to a millisecond): past it the key
-- cannot change any decision. A TAT not after now is such a key already: deleted.
local function store(s, ns)
  if ahead_of_now(s, ns) <= 0 then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], string.format('%d:%d', s, ns), 'PXAT', s * 1000 + math.ceil(ns / 1000000))
  end
end
