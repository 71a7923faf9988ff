-- registry_report: processes say which identities they use, with which values, so operators
-- can list the namespace's identities by name (keys hold only hashes) and see when processes
-- disagree on one identity's values (drift). Each process reports every identity it used since
-- its last report, every few seconds, and at once when it starts using one or its values change.
--
-- KEYS[1]  registry hash `caracal:v1:{<namespace>}:registry`: per identity tag, fields
--          `<tag>:d` (JSON [kind, name, operation, scope]), `<tag>:v` (values, "key=value …"),
--          `<tag>:w` (where each value came from), `<tag>:r` (who reported it last),
--          `<tag>:t` (when, ms), `<tag>:x` (drift noticed until, ms), `<tag>:f` (the version of
--          the fleet's overrides the reporter resolved its values under)
-- KEYS[2]  expiry sorted set `caracal:v1:{<namespace>}:registry:expiry`: tag -> ms past which
--          the identity is forgotten
-- ARGV     1 most identities kept, 2 how long drift stays noticed (ms), then 7 per identity:
--          tag, description, values, sources, reporter ("<process>/<call site>"), ttl (ms)
--          and the fleet overrides' version
-- Reply    per identity, 1 when processes disagree on its values (drift), else 0
-- TTL      an identity is forgotten at the latest reported time + its ttl (the state it
--          describes lives no longer); past the bound, the soonest to expire go first, at most
--          100 + N of them per call (so a registry far past its bound shrinks over a few
--          calls, each of bounded cost). The keys themselves never expire while identities are
--          reported.
-- Cost     O(N log M) for N identities reported among M kept (callers send at most 100), plus
--          up to 100 expired and 100 + N excess removed: well under a millisecond.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local registry, expiry = KEYS[1], KEYS[2]
local most, drift_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local fields = {'d', 'v', 'w', 'r', 't', 'x', 'f'}

local function forget(tag)
  for _, field in ipairs(fields) do
    redis.call('HDEL', registry, tag .. ':' .. field)
  end
  redis.call('ZREM', expiry, tag)
end

for _, tag in ipairs(redis.call('ZRANGE', expiry, '-inf', now, 'BYSCORE', 'LIMIT', 0, 100)) do
  forget(tag)
end

local reply = {}
for i = 3, #ARGV, 7 do
  local tag, description, values, sources, reporter, ttl, fleet =
    ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], tonumber(ARGV[i + 5]),
    ARGV[i + 6]
  local seen = redis.call('HMGET', registry, tag .. ':v', tag .. ':r', tag .. ':t', tag .. ':x',
    tag .. ':f')
  local drift_until = tonumber(seen[4]) or 0
  -- Another reporter asserted other values recently, under the same fleet overrides: both
  -- are in use. (Under different versions, the fleet is applying a change.)
  if seen[1] and seen[1] ~= values and seen[2] ~= reporter and seen[5] == fleet
      and now - tonumber(seen[3]) < drift_ms then
    drift_until = now + drift_ms
  end
  redis.call('HSET', registry, tag .. ':d', description, tag .. ':v', values,
    tag .. ':w', sources, tag .. ':r', reporter, tag .. ':t', now, tag .. ':x', drift_until,
    tag .. ':f', fleet)
  redis.call('ZADD', expiry, 'GT', now + ttl, tag)
  redis.call('ZADD', expiry, 'NX', now + ttl, tag)
  reply[#reply + 1] = drift_until > now and 1 or 0
end

local excess = math.min(redis.call('ZCARD', expiry) - most, 100 + #reply)
if excess > 0 then
  for _, tag in ipairs(redis.call('ZRANGE', expiry, 0, excess - 1)) do
    forget(tag)
  end
end
return reply
