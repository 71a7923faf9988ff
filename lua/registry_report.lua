-- registry_report: processes say which identities they use, with which values, so operators
-- can list the namespace's identities by name (keys hold only hashes) and see when processes
-- disagree on one identity's values (drift). Each process reports every identity it used since
-- its last report, every few seconds, and at once when it starts using one or its values change.
--
-- KEYS[1]  the registry's hashes' common prefix `caracal:v1:{<namespace>}:entries:`: the
--          identity tagged T lives in the hash named KEYS[1] followed by T's first two hex
--          digits, in two fields, `<T>` (its head) and `<T>:u` (each process's values), as
--          registry_prelude.lua lays them out: 256 hashes in the namespace's slot by its hash
--          tag (a script may touch them undeclared), so no hash holds more than a few hundred
--          fields and growing one never costs a large table's resize
-- KEYS[2]  expiry sorted set `caracal:v1:{<namespace>}:entries:expiry`: tag -> ms past which
--          the identity is forgotten
-- KEYS[3]  processes hash `caracal:v1:{<namespace>}:processes`: per reporting process, fields
--          `<process>` (JSON: host, pid, version, identities) and `<process>:t` (last report, ms)
-- KEYS[4]  its expiry sorted set `caracal:v1:{<namespace>}:processes:expiry`
-- KEYS[5]  the single hash the earliest versions kept every identity in,
--          `caracal:v1:{<namespace>}:registry`, and KEYS[6] its expiry set `…:registry:expiry`;
--          KEYS[7] the prefix of the 256 hashes the versions after kept eight fields per
--          identity in, `…:identities:`, and KEYS[8] their expiry set `…:identities:expiry`:
--          still read (registry_read.lua) and written by processes of those versions during
--          a rolling upgrade; a report forgets what expired there, as those versions do, so
--          the old keys empty and go once no process writes them, but for retry budgets: a
--          budget's entry is written in the eight-field layout as well (all fields but `:x`
--          and `:u`), so an earlier process still finds a budget defined only in an upgraded
--          service (a hedge's). Those entries stay while this version reports the budget,
--          each forgotten its ttl after the last report as the others, and the layout is kept
--          within ARGV[1] identities by the same report
-- ARGV     1 most identities kept, 2 how long drift stays noticed (ms), 3 the reporting process,
--          4 its record, 5 how long it is listed without another report (ms), 6 the most
--          processes an identity's `<tag>:u` holds (past it the longest silent goes), then 8
--          per identity: tag, description, values, sources, reporter ("<process>/<call site>"), ttl
--          (ms), the fleet overrides' version and the process's extra (JSON)
-- Reply    per identity handled, 1 when processes disagree on its values (drift), else 0: the
--          first identities sent, at least one, until the `<tag>:u` maps it decoded add up to
--          USES_READ bytes (the caller sends the rest again in another call)
-- TTL      a process is forgotten its ttl after its last report, at most 8 of them per call;
--          an identity is forgotten at the latest reported time + its ttl (the state it
--          describes lives no longer), at most 8 per call; past the bound, the soonest to
--          expire go first, at most 8 + N of them per call (so a registry far past its bound
--          shrinks over a few calls, each of bounded cost); at most 8 expired of each earlier
--          layout per call, and when retry budgets were written to the eight-field layout, its
--          excess the same way (at most 8 + the budgets written). The keys themselves never
--          expire while identities are reported.
-- Cost     O(N (log M + P)) for N identities reported among M kept (callers send at most
--          8), each with the values of at most P processes (ARGV[6]) and their maps of at most
--          USES_READ bytes together beyond the first (decoding and encoding them is a report's
--          largest cost: 8 maps of 100 processes' took 1.7 ms; a map that holds only the
--          reporting process, or none, is written without being decoded), plus up to 8
--          processes, 8 expired (and 8 of each earlier layout) and 8 + N excess identities
--          (and 8 + N of the eight-field layout's) removed: whatever the size of the
--          registry, a call runs a bounded number of commands (an identity's two fields are
--          read with one HMGET and written with one HSET, a retry budget's earlier entry with
--          one HSET and one ZADD more, the expiries of all in one ZADD, and each forgetting is
--          one ZCOUNT or ZCARD, one ZRANGE and one ZREMRANGEBYRANK for the lot and one HDEL per
--          hash it touches), each on a hash of a few hundred fields.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local most, drift_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local process, record, process_ttl = ARGV[3], ARGV[4], tonumber(ARGV[5])
local most_uses = tonumber(ARGV[6])
local mine = process .. '/'

-- Where each layout keeps its entries: the prefix of its hashes, how many of a tag's hex
-- digits follow it, the expiry set, and the suffixes of an entry's fields.
local entries = {prefix = KEYS[1], digits = 2, set = KEYS[2], suffixes = {'', ':u'}}
local processes = {prefix = KEYS[3], digits = 0, set = KEYS[4], suffixes = {'', ':t'}}
local earliest = {prefix = KEYS[5], digits = 0, set = KEYS[6], suffixes = EARLIER_FIELDS}
local earlier = {prefix = KEYS[7], digits = 2, set = KEYS[8], suffixes = EARLIER_FIELDS}

-- The hash of the entry tagged `tag` in `layout`.
local function hash_of(layout, tag)
  return layout.prefix .. string.sub(tag, 1, layout.digits)
end

-- Forgets the `count` entries of `layout` that expire soonest, their fields with them: one
-- ZRANGE and one ZREMRANGEBYRANK for them all and one HDEL per hash, whatever their number
-- (bounded by callers).
local function forget(layout, count)
  if count <= 0 then
    return
  end
  local names, hashes = {}, {}
  for _, tag in ipairs(redis.call('ZRANGE', layout.set, 0, count - 1)) do
    local at = hash_of(layout, tag)
    if not names[at] then
      names[at] = {}
      hashes[#hashes + 1] = at
    end
    for _, suffix in ipairs(layout.suffixes) do
      names[at][#names[at] + 1] = tag .. suffix
    end
  end
  for _, at in ipairs(hashes) do
    redis.call('HDEL', at, unpack(names[at]))
  end
  redis.call('ZREMRANGEBYRANK', layout.set, 0, count - 1)
end

local FORGET = 8
-- Forgets at most FORGET of `layout`'s expired entries (those ranked first).
local function forget_expired(layout)
  forget(layout, math.min(redis.call('ZCOUNT', layout.set, '-inf', now), FORGET))
end

-- The bytes of `<tag>:u` maps a call decodes and encodes again, past which it stops: 32 KiB
-- is two maps of 100 processes' values (about 0.2 ms each on a loaded 2-core machine).
local USES_READ = 32768
local uses_read = 0
forget_expired(processes)
redis.call('HSET', processes.prefix, process, record, process .. ':t', now)
redis.call('ZADD', processes.set, now + process_ttl, process)
forget_expired(entries)
forget_expired(earliest)
forget_expired(earlier)

-- What `uses` (JSON {process: [values, ms, extra]}) keeps with this process's report added:
-- the others that reported within the drift window, the longest silent gone past the bound
-- (so a report's cost does not grow with the fleet); and how many processes that is.
local function uses_with(uses, values, extra)
  -- An unreadable map (written by another version) starts again from this report.
  local read, decoded = pcall(cjson.decode, uses)
  local kept, held = {}, 0
  if read and type(decoded) == 'table' then
    for other, use in pairs(decoded) do
      if other ~= process and type(use) == 'table' and tonumber(use[2])
          and now - tonumber(use[2]) < drift_ms then
        kept[other] = use
        held = held + 1
      end
    end
  end
  while held >= most_uses do
    local oldest, oldest_at = nil, math.huge
    for other, use in pairs(kept) do
      if tonumber(use[2]) < oldest_at then
        oldest, oldest_at = other, tonumber(use[2])
      end
    end
    kept[oldest] = nil
    held = held - 1
  end
  kept[process] = {values, now, extra}
  return cjson.encode(kept), held + 1
end

-- How a retry budget's description starts (JSON [kind, name, operation, scope]).
local LOOKED_UP = '["retry_budget",'
local reply, expiries, budgets = {}, {}, 0
for i = 7, #ARGV, 8 do
  local tag, description, values, sources, reporter, ttl, fleet, extra =
    ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], tonumber(ARGV[i + 5]),
    ARGV[i + 6], ARGV[i + 7]
  local hash = hash_of(entries, tag)
  local seen = redis.call('HMGET', hash, tag, tag .. ':u')
  local t, x, f, n, r, v = 0, 0, '', 0, '', ''
  if seen[1] then
    -- One this version cannot read starts again from this report.
    t, x, f, n, r, v = parts_of(seen[1])
    if not t then
      t, x, f, n, r, v = 0, 0, '', 0, '', ''
    end
  end
  local drift_until = x
  -- Another reporter asserted other values recently, under the same fleet overrides: both
  -- are in use. (Under different versions, the fleet is applying a change. One only an
  -- operator entered has no reporter, and no values to drift from.)
  if r ~= '' and v ~= values and r ~= reporter and f == fleet and now - t < drift_ms then
    drift_until = now + drift_ms
  end
  local uses, held
  -- The map holds the last reporter, and no other when it holds one: when that is this
  -- process, or fell silent past the window, this report replaces it undecoded.
  if not seen[2] or n == 0
      or (n == 1 and (string.sub(r, 1, #mine) == mine or now - t >= drift_ms)) then
    uses, held = cjson.encode({[process] = {values, now, extra}}), 1
  else
    uses_read = uses_read + #seen[2]
    uses, held = uses_with(seen[2], values, extra)
  end
  redis.call('HSET', hash, tag, head_of(now, drift_until, fleet, held, reporter, values,
    sources, description), tag .. ':u', uses)
  expiries[#expiries + 1] = now + ttl
  expiries[#expiries + 1] = tag
  -- A process of an earlier version finds a retry budget its own configuration lacks (a
  -- hedge's, defined in another service) in its own layout only: a budget is written there
  -- too, all but the processes' map (that version's own reporters keep theirs), so such a
  -- process finds it while this version reports it. Only budgets: they are few, and only
  -- their lookup by an earlier process matters.
  -- Its drift field `:x` is left as it is: that version's reports record there the drift
  -- they notice against this one's values (this version's own reaches the listing from its
  -- head), and an absent one reads as none. The fields written track EARLIER_FIELDS (all but
  -- `:x` and `:u`).
  if string.sub(description, 1, #LOOKED_UP) == LOOKED_UP then
    redis.call('HSET', hash_of(earlier, tag), tag .. ':d', description, tag .. ':v', values,
      tag .. ':w', sources, tag .. ':r', reporter, tag .. ':t', now, tag .. ':f', fleet)
    redis.call('ZADD', earlier.set, 'GT', now + ttl, tag)
    budgets = budgets + 1
  end
  reply[#reply + 1] = drift_until > now and 1 or 0
  if uses_read >= USES_READ then
    break
  end
end
-- GT adds a new member too: an identity's expiry only moves later.
if #expiries > 0 then
  redis.call('ZADD', entries.set, 'GT', unpack(expiries))
end

forget(entries, math.min(redis.call('ZCARD', entries.set) - most, FORGET + #reply))
-- The budgets' entries in the eight-field layout are kept within the same bound, the soonest
-- to expire first, whether or not a process of that version is left to trim it.
if budgets > 0 then
  forget(earlier, math.min(redis.call('ZCARD', earlier.set) - most, FORGET + budgets))
end
return reply
