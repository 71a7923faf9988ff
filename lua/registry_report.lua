-- registry_report: processes say which identities they use, with which values, so operators
-- can list the namespace's identities by name (keys hold only hashes) and see when processes
-- disagree on one identity's values (drift). Each process reports every identity it used since
-- its last report, every few seconds, and at once when it starts using one or its values change.
--
-- KEYS[1]  the registry's hashes' common prefix `caracal:v1:{<namespace>}:identities:`: the
--          identity tagged T lives in the hash named KEYS[1] followed by T's first two hex
--          digits (256 hashes, `…:identities:00` to `…:identities:ff`, in the namespace's slot
--          by its hash tag: a script may touch them undeclared), so no hash holds more than a
--          few hundred fields and growing one never costs a large table's resize (one hash of
--          80 000 fields took over 1 ms to grow). Per identity tag, fields
--          `<tag>:d` (JSON [kind, name, operation, scope]), `<tag>:v` (values, "key=value …"),
--          `<tag>:w` (where each value came from), `<tag>:r` (who reported it last),
--          `<tag>:t` (when, ms), `<tag>:x` (drift noticed until, ms), `<tag>:f` (the version of
--          the fleet's overrides the reporter resolved its values under), `<tag>:u` (JSON
--          {process: [values, ms, extra]}: each process's values as it last reported them and
--          what it added (its decisions per second, the overrides it ignores), kept for as long
--          as drift stays noticed, so a reader counts the processes using each value and adds
--          up the fleet's rates)
-- KEYS[2]  expiry sorted set `caracal:v1:{<namespace>}:identities:expiry`: tag -> ms past
--          which the identity is forgotten
-- KEYS[3]  processes hash `caracal:v1:{<namespace>}:processes`: per reporting process, fields
--          `<process>` (JSON: host, pid, version, identities) and `<process>:t` (last report, ms)
-- KEYS[4]  its expiry sorted set `caracal:v1:{<namespace>}:processes:expiry`
-- KEYS[5]  the single hash earlier versions kept every identity in,
--          `caracal:v1:{<namespace>}:registry` (fields as above), and KEYS[6] its expiry sorted
--          set `…:registry:expiry`: still read (registry_read.lua) and written by processes of
--          those versions during a rolling upgrade; a report forgets what expired there, as
--          those versions do, so the old keys empty and go once no process writes them
-- ARGV     1 most identities kept, 2 how long drift stays noticed (ms), 3 the reporting process,
--          4 its record, 5 how long it is listed without another report (ms), 6 the most
--          processes an identity's `<tag>:u` holds (past it the longest silent goes), then 8
--          per identity: tag, description, values, sources, reporter ("<process>/<call site>"), ttl
--          (ms), the fleet overrides' version and the process's extra (JSON)
-- Reply    per identity handled, 1 when processes disagree on its values (drift), else 0: the
--          first identities sent, at least one, until their `<tag>:u` maps add up to USES_READ
--          bytes (the caller sends the rest again in another call)
-- TTL      a process is forgotten its ttl after its last report, at most 8 of them per call;
--          an identity is forgotten at the latest reported time + its ttl (the state it
--          describes lives no longer), at most 8 per call; past the bound, the soonest to
--          expire go first, at most 8 + N of them per call (so a registry far past its bound
--          shrinks over a few calls, each of bounded cost); at most 8 expired of the earlier
--          versions' hash per call. The keys themselves never expire while identities are
--          reported.
-- Cost     O(N (log M + P)) for N identities reported among M kept (callers send at most
--          8), each with the values of at most P processes (ARGV[6]) and their maps of at most
--          USES_READ bytes together beyond the first (decoding and encoding them is a report's
--          largest cost: 8 maps of 100 processes' took 1.7 ms), plus up to 8
--          processes, 8 expired (and 8 of the earlier versions' hash) and 8 + N excess
--          identities removed: whatever the size of the registry, a call runs a bounded number
--          of commands (each forgetting is one ZREM for the lot and one HDEL per hash it
--          touches), well under a millisecond, each on a hash of a few hundred fields.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local registry, expiry, processes, processes_expiry = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local earlier, earlier_expiry = KEYS[5], KEYS[6]
local most, drift_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local process, record, process_ttl = ARGV[3], ARGV[4], tonumber(ARGV[5])
local most_uses = tonumber(ARGV[6])
local fields = {'d', 'v', 'w', 'r', 't', 'x', 'f', 'u'}

-- The hash of the identity tagged `tag`.
local function hash_of(tag)
  return registry .. tag:sub(1, 2)
end

-- Forgets what `set`'s sorted set lists among `gone`, each tag's `suffixes` fields with it,
-- from the hash `hash` names it in: one ZREM for them all and one HDEL per hash, whatever
-- their number (bounded by callers).
local function forget(hash, set, gone, suffixes)
  if #gone == 0 then
    return
  end
  local names, hashes = {}, {}
  for _, tag in ipairs(gone) do
    local at = hash(tag)
    if not names[at] then
      names[at] = {}
      hashes[#hashes + 1] = at
    end
    for _, suffix in ipairs(suffixes) do
      names[at][#names[at] + 1] = tag .. suffix
    end
  end
  for _, at in ipairs(hashes) do
    redis.call('HDEL', at, unpack(names[at]))
  end
  redis.call('ZREM', set, unpack(gone))
end

-- `hash` as a `forget` names it, for every tag alike.
local function only(hash)
  return function()
    return hash
  end
end

local FORGET = 8
-- The bytes of `<tag>:u` maps a call decodes and encodes again, past which it stops: 32 KiB
-- is two maps of 100 processes' values (about 0.2 ms each on a loaded 2-core machine).
local USES_READ = 32768
local uses_read = 0
forget(only(processes), processes_expiry,
  redis.call('ZRANGE', processes_expiry, '-inf', now, 'BYSCORE', 'LIMIT', 0, FORGET), {'', ':t'})
redis.call('HSET', processes, process, record, process .. ':t', now)
redis.call('ZADD', processes_expiry, now + process_ttl, process)

local suffixes = {}
for i, field in ipairs(fields) do
  suffixes[i] = ':' .. field
end
forget(hash_of, expiry,
  redis.call('ZRANGE', expiry, '-inf', now, 'BYSCORE', 'LIMIT', 0, FORGET), suffixes)
forget(only(earlier), earlier_expiry,
  redis.call('ZRANGE', earlier_expiry, '-inf', now, 'BYSCORE', 'LIMIT', 0, FORGET), suffixes)

local reply = {}
for i = 7, #ARGV, 8 do
  local tag, description, values, sources, reporter, ttl, fleet, extra =
    ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], tonumber(ARGV[i + 5]),
    ARGV[i + 6], ARGV[i + 7]
  local hash = hash_of(tag)
  local seen = redis.call('HMGET', hash, tag .. ':v', tag .. ':r', tag .. ':t', tag .. ':x',
    tag .. ':f', tag .. ':u')
  local drift_until = tonumber(seen[4]) or 0
  -- Another reporter asserted other values recently, under the same fleet overrides: both
  -- are in use. (Under different versions, the fleet is applying a change.)
  if seen[1] and seen[1] ~= values and seen[2] ~= reporter and seen[5] == fleet
      and now - tonumber(seen[3]) < drift_ms then
    drift_until = now + drift_ms
  end
  -- An unreadable map (written by another version) starts again from this report.
  local read, uses = pcall(cjson.decode, seen[6] or '{}')
  uses_read = uses_read + #(seen[6] or '')
  local kept, held = {}, 0
  if read and type(uses) == 'table' then
    for other, use in pairs(uses) do
      if other ~= process and type(use) == 'table' and tonumber(use[2])
          and now - tonumber(use[2]) < drift_ms then
        kept[other] = use
        held = held + 1
      end
    end
  end
  -- Bounded, so a report's cost does not grow with the fleet: the longest silent goes first.
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
  redis.call('HSET', hash, tag .. ':d', description, tag .. ':v', values,
    tag .. ':w', sources, tag .. ':r', reporter, tag .. ':t', now, tag .. ':x', drift_until,
    tag .. ':f', fleet, tag .. ':u', cjson.encode(kept))
  -- GT adds a new member too: an identity's expiry only moves later.
  redis.call('ZADD', expiry, 'GT', now + ttl, tag)
  reply[#reply + 1] = drift_until > now and 1 or 0
  if uses_read >= USES_READ then
    break
  end
end

local excess = math.min(redis.call('ZCARD', expiry) - most, FORGET + #reply)
if excess > 0 then
  forget(hash_of, expiry, redis.call('ZRANGE', expiry, 0, excess - 1), suffixes)
end
return reply
