-- The rate limit's GCRA admission. One admission per `interval` on average, up to `burst` at
-- once after idle time. Same decision as `admit` in the Rust kernel beside this file (mod.rs).
--
-- KEYS[1]  `caracal:v1:{<identity>}:rate:ns`: the theoretical arrival time (TAT) as
--          "<seconds>:<nanoseconds>" of server time. Time is kept as a (seconds, nanoseconds)
--          pair so every sum stays an exact integer in Lua's doubles (while interval x burst
--          stays under 2^53 ns, about 104 days; beyond, rounding errs by nanoseconds); the
--          interval is whole
--          nanoseconds, rounded up from 1/rate, so rounding never admits more than asked
--          (@gkoos/caracal rounds to whole milliseconds: 700/s becomes 1000/s).
-- ARGV[1]  emission interval in nanoseconds (integer >= 1)
-- ARGV[2]  burst (integer >= 1)
-- ARGV[3]  arrivals: how many callers to decide, one after the other at the same instant
--          (exactly as that many single calls would be)
-- Reply    per arrival, {allowed, retry_after_ns}: 1, 0 when admitted (the TAT moves one
--          interval on); 0 and the wait until the next admission is possible (> 0) when
--          rejected.
-- TTL      PXAT at the new TAT: past it the key cannot change any decision.
-- Cost     O(N) for N arrivals, 3 commands (TIME, GET, SET) whatever N.
local clock = redis.call('TIME')
local now_s, now_ns = tonumber(clock[1]), tonumber(clock[2]) * 1000
local interval = tonumber(ARGV[1])
local burst_delay = interval * (tonumber(ARGV[2]) - 1)

local tat_s, tat_ns = now_s, now_ns
local stored = redis.call('GET', KEYS[1])
if stored then
  local sep = string.find(stored, ':', 1, true)
  local s, ns = tonumber(string.sub(stored, 1, sep - 1)), tonumber(string.sub(stored, sep + 1))
  if s > now_s or (s == now_s and ns > now_ns) then
    tat_s, tat_ns = s, ns
  end
end

local reply = {}
local moved = false
for _ = 1, tonumber(ARGV[3]) do
  local ahead = (tat_s - now_s) * 1000000000 + (tat_ns - now_ns)
  if ahead > burst_delay then
    reply[#reply + 1] = 0
    reply[#reply + 1] = ahead - burst_delay
  else
    local total = tat_ns + interval
    tat_ns = total % 1000000000
    tat_s = tat_s + (total - tat_ns) / 1000000000
    moved = true
    reply[#reply + 1] = 1
    reply[#reply + 1] = 0
  end
end
if moved then
  redis.call('SET', KEYS[1], string.format('%d:%d', tat_s, tat_ns),
    'PXAT', tat_s * 1000 + math.ceil(tat_ns / 1000000))
end
return reply
