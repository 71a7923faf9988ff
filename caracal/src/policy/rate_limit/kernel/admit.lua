-- The rate limit's GCRA admission. One admission per `interval` on average, up to `burst` at
-- once after idle time. Same decision as `decide` in the Rust kernel beside this file (mod.rs).
-- Sent after prelude.lua, which reads the clock and the stored TAT.
--
-- KEYS[1]  the TAT (see prelude.lua)
-- ARGV[1]  emission interval in nanoseconds (integer >= 1)
-- ARGV[2]  burst (integer >= 1)
-- ARGV[3]  take: how many emissions each admitted arrival takes (integer >= 1): its own, and
--          up to take - 1 more while the burst allows them now (each is admitted now, exactly
--          as that many arrivals would be), for its process to hand out (prefetch). Every
--          arrival's own is decided first, as with take 1; the extras come from what the burst
--          allows after them, so taking more never refuses an arrival of the same call
-- ARGV[4]  arrivals: how many callers to decide at the same instant, the highest share first,
--          arrivals of one share in their order: their own emissions one after the other,
--          exactly as that many single calls of take 1 would be; extras after (ARGV[3])
-- ARGV[5…] one share per arrival: the share of the burst its caller's priority class may use,
--          in thousandths (1000: the whole burst). Its cap is ceil(burst * share / 1000),
--          clamped to [1, burst]; it is admitted only while the burst in use,
--          ceil((TAT - now) / interval), is below its cap: while the TAT is ahead of now by at
--          most interval x (cap - 1).
-- Reply    per arrival, in the arrivals' order, five integers: when admitted, 1, the emissions
--          taken beyond its own, how far (ns) the TAT it left is ahead of now, and that TAT's
--          seconds and nanoseconds (each emission taken moves the TAT one interval on; the TAT
--          an arrival left is the one after its last extra, or after its own without any); when
--          rejected, 0, the wait until an admission of its class is possible (> 0), 0, 0, 0.
-- TTL      PXAT at the new TAT: past it the key cannot change any decision.
-- Cost     O(N x take) for N arrivals (N log N when their shares differ), 3 commands (TIME,
--          GET, SET) whatever N.
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local take = tonumber(ARGV[3])
local arrivals = tonumber(ARGV[4])

local tat_s, tat_ns = now_s, now_ns
if stored and ahead_of_now(stored_s, stored_ns) > 0 then
  tat_s, tat_ns = stored_s, stored_ns
end

-- Each arrival's delay (interval x (cap - 1)), and the order they are decided in: highest share
-- first, ties in their order (the kernel's stable sort).
local delays, order, mixed = {}, {}, false
for i = 1, arrivals do
  local share = tonumber(ARGV[4 + i])
  local cap = math.min(math.max(math.floor((burst * share + 999) / 1000), 1), burst)
  delays[i] = interval * (cap - 1)
  order[i] = i
  mixed = mixed or share ~= tonumber(ARGV[5])
end
if mixed then
  local function share(i) return tonumber(ARGV[4 + i]) end
  table.sort(order, function(a, b)
    local sa, sb = share(a), share(b)
    return sa > sb or (sa == sb and a < b)
  end)
end

-- First every arrival's own emission, as without prefetch: an arrival's extras never refuse an
-- arrival of the same call. Then each admitted arrival's extras, from what the burst still allows.
local reply = {}
local moved = false
for _, i in ipairs(order) do
  local ahead = ahead_of_now(tat_s, tat_ns)
  local at = 5 * (i - 1)
  if ahead > delays[i] then
    reply[at + 1], reply[at + 2] = 0, ahead - delays[i]
    reply[at + 3], reply[at + 4], reply[at + 5] = 0, 0, 0
  else
    tat_s, tat_ns = shifted(tat_s, tat_ns, interval)
    moved = true
    reply[at + 1], reply[at + 2], reply[at + 3] = 1, 0, ahead_of_now(tat_s, tat_ns)
    reply[at + 4], reply[at + 5] = tat_s, tat_ns
  end
end
for _, i in ipairs(order) do
  local at = 5 * (i - 1)
  if reply[at + 1] == 1 then
    local extra = 0
    while extra + 1 < take and ahead_of_now(tat_s, tat_ns) <= delays[i] do
      tat_s, tat_ns = shifted(tat_s, tat_ns, interval)
      extra = extra + 1
    end
    if extra > 0 then
      reply[at + 2], reply[at + 3] = extra, ahead_of_now(tat_s, tat_ns)
      reply[at + 4], reply[at + 5] = tat_s, tat_ns
    end
  end
end
if moved then
  store(tat_s, tat_ns)
end
return reply
