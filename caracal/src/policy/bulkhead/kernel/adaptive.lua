-- An adaptive limit: a process's report (its calls and its vote) joins the identity's open
-- window, and once the window has passed the limit is updated from the votes. Same step as
-- `Adapt` in the Rust kernel beside this file (adaptive.rs), whose module docs give the
-- algorithm.
--
-- KEYS[1]  `caracal:v1:{<identity>}:adaptive`: a hash. `limit` (thousandths), `latency` and
--          `base` (µs), `since` and `lowat` (ms of server time), `cut` (0 or 1), `level` (the last
--          window's highest occupancy), `every` (ms from `lowat` to the next cut; read within
--          [10 s, 40 s], absent as 10 s; an older script leaves it untouched, which costs at
--          most one period of 40 s after a mixed fleet or a rollback), `settled` (the limit of
--          the last window outside a cut whose votes were not queued; 0: none), `measured` (the
--          voters' mean base, µs, the last cut or window with a low share left, or that had
--          fallen a quarter below it; 0: none; an older script leaves it untouched, which
--          costs at most one cut per such fall), and the open
--          window's `n`, `sum`, `calls`, `low`, `peak`, `queued`, `clear`, `unsure`, `ratios`,
--          `bases`, `clears` (the clear votes' ratios), `lown` and `lowsum` (the successes at low
--          occupancy and their latencies, which stand for a cut's latency), `refused` (calls
--          the fleet was full for: its limit, or a class's share of it, refused them);
--          `askers`, the processes counted in the open window, and `procs`, in the last window
--          that closed. In a mixed fleet an older script adds its processes' figures but not to
--          the last four, nor clears them when it closes a window: its clear votes read as
--          unqueued and stale `clears` as queued, so a probe's growth stays within the older
--          script's 1.2 ×, `lown`/`lowsum` are read only while within the window's `n`/`sum`,
--          and a stale `refused` reads as a full fleet, cut on its period as before. Nor does it
--          move `settled`: a growth it made is verified by a cut or, within a probe's growth of
--          the last settled limit, undone to no lower than that limit.
-- ARGV     samples, sum (µs), calls, low, peak, queued, clear, unsure, ratios, bases, min,
--          initial, max, window (ms), joined, clears, low samples, low sum (µs), refused:
--          integers.
--          `joined` is the `since` the reporting process's last report that asked for slots
--          (with calls, or a peak: a lease reply, admitted or refused, or a call refused at the
--          process's share) was answered with (0:
--          none): such a report whose `joined` is not the open window's start counts its
--          process in the window.
-- Reply    {limit, full, low, latency, base, since, procs}: the whole limit in force (`low`
--          in a cut window) and the limit, within [min, max]; the occupancy up to which a call
--          counts as low (¾ of the limit, or of the last window's highest occupancy if lower);
--          the mean latency (a cut's: of its calls at low occupancy) and the voters' mean base
--          of the last window (0: none yet); when
--          the window this report joined started (ms); the processes counted in the last
--          window that closed (at most 2^32 - 1).
-- TTL      PEXPIREAT now + 600 s (`IDLE_MS`) at every step.
-- Cost     O(1): one HMGET, one HSET, one PEXPIREAT.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local MAX_SUM = 9007199254740991
local IDLE_MS = 600000
local LOW_PM, CLEAR_PM, QUEUED_PM, GROWTH_PM = 750, 1100, 1250, 1200
local CUT_EVERY_MS, LOW_SHARE_PM, VERIFY_MS, MIN_BASE = 10000, 100, 3000, 3
local MAX_CUT_EVERY_MS = 4 * CUT_EVERY_MS
local DEEPER_PM = (LOW_PM + 1000000 / QUEUED_PM) / 2
local DEEPER_WHOLE_PM = math.floor((1000 + 3 * DEEPER_PM) / 4)
local ABOVE_PM, MAX_LATENCY_US = math.floor(1000000 / CLEAR_PM), 600000000
local FALLEN_PM = LOW_PM
local a = {}
for i = 1, 15 do
  a[i] = tonumber(ARGV[i])
end
for i = 16, 19 do
  a[i] = tonumber(ARGV[i]) or 0
end
local min, initial, max, window = a[11], a[12], a[13], a[14]

local fields = {'limit', 'latency', 'base', 'since', 'lowat', 'cut', 'level', 'every', 'n', 'sum',
  'calls', 'low', 'peak', 'queued', 'clear', 'unsure', 'ratios', 'bases', 'askers', 'procs',
  'clears', 'lown', 'lowsum', 'settled', 'measured', 'refused'}
local stored = redis.call('HMGET', KEYS[1], unpack(fields))
-- What something else wrote (negative, fractional, huge, not a number) reads as a count, as
-- the kernel's integers would hold it, so that no foreign field turns the step's arithmetic
-- fractional or the reply into something other than counts.
local function count(n)
  if not (n >= 0) then
    return 0
  end
  return math.min(math.floor(n), MAX_SUM)
end
local e = {}
for i = 1, #fields do
  e[i] = count(tonumber(stored[i]) or 0)
end
local limit, latency, base, since, lowat, level = e[1], e[2], e[3], e[4], e[5], e[7]
local cut = 0
if e[6] == 1 then
  cut = 1
end
-- Absent (an older script's hash) or foreign: read within [CUT_EVERY_MS, MAX_CUT_EVERY_MS],
-- never a period that cuts every window or never cuts.
local every = math.min(math.max(e[8], CUT_EVERY_MS), MAX_CUT_EVERY_MS)
-- The open window: samples, sum, calls, low, peak, queued, clear, unsure, ratios, bases,
-- clears, low samples, low sum, refused.
local w = {e[9], e[10], e[11], e[12], e[13], e[14], e[15], e[16], e[17], e[18], e[21], e[22],
  e[23], e[26]}
local askers, procs, settled, measured = e[19], e[20], e[24], e[25]
if limit == 0 then
  askers, procs, settled, measured = 0, 0, 0, 0
  limit, latency, base, since, lowat, cut, level = initial * 1000, 0, 0, now, 0, 0, 0
  lowat = math.max(now - CUT_EVERY_MS, 0)
  every = CUT_EVERY_MS
  w = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
end
-- Server time that stepped back (a failover to a replica whose clock is behind) or a foreign
-- time: a window that started, or calls at low occupancy seen, after now would hold the limit
-- or its next cut until the clock caught up.
since, lowat = math.min(since, now), math.min(lowat, now)
limit = math.min(math.max(limit, min * 1000), max * 1000)

-- The occupancy the fleet ran at: the limit or, lower, the last window's highest.
local function occupancy_pm()
  if level > 0 then
    return math.min(limit, level * 1000)
  end
  return limit
end

-- ¾ of it: the occupancy up to which a call is at low occupancy, and a cut window's limit in
-- force.
local function low_pm()
  return math.floor(occupancy_pm() * LOW_PM / 1000)
end

for i = 1, 10 do
  if i == 5 then
    w[i] = math.max(w[i], a[i])
  else
    w[i] = math.min(w[i] + a[i], MAX_SUM)
  end
end
for i = 11, 14 do
  w[i] = math.min(w[i] + a[i + 5], MAX_SUM)
end
local joined = since
if (a[3] > 0 or a[5] > 0) and a[15] ~= joined then
  askers = math.min(askers + 1, MAX_SUM)
end

if now >= since + window then
  local samples, sum, calls, low, peak = w[1], w[2], w[3], w[4], w[5]
  local queued, clear, unsure, ratios, bases, clears = w[6], w[7], w[8], w[9], w[10], w[11]
  if calls > 0 then
    local before, cut_pm, occupancy, deeper, above = latency, low_pm(), occupancy_pm(), false, nil
    -- A cut's latency is its own calls', those admitted at low occupancy, once processes had
    -- bases to count latencies against, and on enough of them.
    local deeper_pm, own = DEEPER_WHOLE_PM, false
    if cut == 1 and base > 0 and w[12] >= MIN_BASE and w[12] <= samples and w[13] <= sum then
      samples, sum, deeper_pm, own = w[12], w[13], DEEPER_PM, true
    end
    if samples > 0 then
      latency = math.floor(sum / samples)
      -- A cut whose latency fell with its occupancy still queued; one of its own calls that
      -- fell by less, but by more than at 1.1 x C, did not: Little's law gives C.
      deeper = cut == 1 and before > 0 and latency * 1000 <= before * deeper_pm
      local fell = latency * 1000 < before * ABOVE_PM
      if own and not deeper and latency <= MAX_LATENCY_US and fell then
        above = math.floor(latency * 1000 / before)
      end
    end
    local low_share = low > 0 and low * 1000 >= calls * LOW_SHARE_PM
    if low_share then
      lowat = now
    end
    local weight = queued + clear + unsure
    local target = limit
    local verify, queued_cut = false, false
    if weight > 0 then
      base = math.floor(bases / weight)
      -- Bases that fell by a quarter since a cut or a low share measured them were measured
      -- wrong (a warm-up's): measured again, the limit held, VERIFY_MS or more after the last
      -- cut was called; the next fall is measured from them. Compared up to MAX_LATENCY_US,
      -- exact whatever a field holds.
      local measuring = cut == 1 or low_share
      local fallen = not measuring
        and math.min(base, MAX_LATENCY_US) * 1000 < math.min(measured, MAX_LATENCY_US) * FALLEN_PM
        and now >= lowat + VERIFY_MS
      if measuring or fallen then
        measured = base
      end
      if fallen then
        verify = true
      elseif queued * 2 > weight then
        local ratio = math.max(math.floor(ratios / queued), QUEUED_PM)
        local lowered = math.floor(limit * CLEAR_PM / ratio)
        if now < lowat + VERIFY_MS then
          target = lowered
          queued_cut = cut == 1
        elseif limit > settled and limit * 2000 <= settled * (1000 + GROWTH_PM) then
          -- Not queued at the limit before a probe's growth, queued now: the growth is undone
          -- without a cut, no further.
          target = math.max(lowered, settled)
          queued_cut = cut == 1
        else
          verify = true
        end
      elseif clear * 2 > weight and cut == 0 then
        settled = limit
        -- The growth tapers to none as the clear votes' ratio nears CLEAR_PM.
        local over = math.min(math.max(math.floor(clears / clear) - 1000, 0), CLEAR_PM - 1000)
        local growth = GROWTH_PM - math.floor((GROWTH_PM - 1000) * over / (CLEAR_PM - 1000))
        target = math.floor(limit * growth / 1000)
      elseif cut == 0 then
        settled = limit
      end
    end
    if deeper then
      target = math.min(target, math.floor(cut_pm * CLEAR_PM / 1000))
    elseif above then
      target = math.min(target, math.floor(math.floor(occupancy * above / 1000) * CLEAR_PM / 1000))
    end
    if peak * 2 * 1000 < limit then
      target = math.min(target, limit)
    end
    target = math.max(target, math.floor(limit / 2))
    -- Lowered at once, raised halfway.
    if target >= limit then
      target = math.floor((limit + target) / 2)
    end
    -- Whether the window's occupancy reached the limit it ran under, or the fleet refused a
    -- call (a class's share of it).
    local filled = peak >= math.floor(limit / 1000) or w[14] > 0
    limit = math.min(math.max(target, min * 1000), max * 1000)
    level = peak
    if deeper then
      level = math.min(peak, math.floor(cut_pm / 1000))
    end
    -- A judged cut (voters weighed half its calls) that did not still queue doubles the period
    -- before the next; one that still queued, a verification, or a window outside a cut mostly
    -- unjudged with no low share (processes without a base) sets it back.
    local judged = weight * 2 >= calls
    if verify or deeper or queued_cut or (cut == 0 and not judged and not low_share) then
      every = CUT_EVERY_MS
    elseif cut == 1 and judged then
      every = math.min(every * 2, MAX_CUT_EVERY_MS)
    end
    -- Not on the period alone in a window that never filled its limit and whose voters weighed
    -- half its calls: a cut would refuse calls the downstream has room for.
    if verify or deeper or now >= lowat + every and (filled or not judged) then
      cut, lowat = 1, now
    else
      cut = 0
    end
  end
  since = now
  w = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
  askers, procs = 0, askers
end

local function int(n)
  return string.format('%d', n)
end
local set = {'limit', int(limit), 'latency', int(latency), 'base', int(base), 'since', int(since),
  'lowat', int(lowat), 'cut', int(cut), 'level', int(level), 'every', int(every),
  'askers', int(askers), 'procs', int(procs), 'settled', int(settled), 'measured', int(measured)}
for i = 1, 10 do
  set[#set + 1] = fields[8 + i]
  set[#set + 1] = int(w[i])
end
for i = 11, 13 do
  set[#set + 1] = fields[10 + i]
  set[#set + 1] = int(w[i])
end
set[#set + 1] = 'refused'
set[#set + 1] = int(w[14])
redis.call('HSET', KEYS[1], unpack(set))
redis.call('PEXPIREAT', KEYS[1], now + IDLE_MS)
local function whole(pm)
  return math.min(math.max(math.floor(pm / 1000), min), max)
end
local low = low_pm()
local in_force = limit
if cut == 1 then
  in_force = low
end
return {whole(in_force), whole(limit), math.floor(low / 1000), latency, base, joined,
  math.min(procs, 4294967295)}
