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
--          (exactly as that many single calls would be), the highest share first, arrivals of
--          one share in their order
-- ARGV[4…] one share per arrival: the share of the burst its caller's priority class may use,
--          in thousandths (1000: the whole burst). Its cap is ceil(burst * share / 1000),
--          clamped to [1, burst]; it is admitted only while the burst in use,
--          ceil((TAT - now) / interval), is below its cap: while the TAT is ahead of now by at
--          most interval x (cap - 1).
-- Reply    per arrival, in the arrivals' order, {allowed, retry_after_ns}: 1, 0 when admitted
--          (the TAT moves one interval on); 0 and the wait until an admission of its class is
--          possible (> 0) when rejected.
-- TTL      PXAT at the new TAT: past it the key cannot change any decision.
-- Cost     O(N) for N arrivals (N log N when their shares differ), 3 commands (TIME, GET,
--          SET) whatever N.
local clock = redis.call('TIME')
local now_s, now_ns = tonumber(clock[1]), tonumber(clock[2]) * 1000
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local arrivals = tonumber(ARGV[3])

local tat_s, tat_ns = now_s, now_ns
local stored = redis.call('GET', KEYS[1])
if stored then
  local sep = string.find(stored, ':', 1, true)
  local s, ns = tonumber(string.sub(stored, 1, sep - 1)), tonumber(string.sub(stored, sep + 1))
  if s > now_s or (s == now_s and ns > now_ns) then
    tat_s, tat_ns = s, ns
  end
end

-- Each arrival's delay (interval x (cap - 1)), and the order they are decided in: highest share
-- first, ties in their order (the kernel's stable sort).
local delays, order, mixed = {}, {}, false
for i = 1, arrivals do
  local share = tonumber(ARGV[3 + i])
  local cap = math.min(math.max(math.floor((burst * share + 999) / 1000), 1), burst)
  delays[i] = interval * (cap - 1)
  order[i] = i
  mixed = mixed or share ~= tonumber(ARGV[4])
end
if mixed then
  local function share(i) return tonumber(ARGV[3 + i]) end
  table.sort(order, function(a, b)
    local sa, sb = share(a), share(b)
    return sa > sb or (sa == sb and a < b)
  end)
end

local reply = {}
local moved = false
for _, i in ipairs(order) do
  local ahead = (tat_s - now_s) * 1000000000 + (tat_ns - now_ns)
  if ahead > delays[i] then
    reply[2 * i - 1] = 0
    reply[2 * i] = ahead - delays[i]
  else
    local total = tat_ns + interval
    tat_ns = total % 1000000000
    tat_s = tat_s + (total - tat_ns) / 1000000000
    moved = true
    reply[2 * i - 1] = 1
    reply[2 * i] = 0
  end
end
if moved then
  redis.call('SET', KEYS[1], string.format('%d:%d', tat_s, tat_ns),
    'PXAT', tat_s * 1000 + math.ceil(tat_ns / 1000000))
end
return reply
