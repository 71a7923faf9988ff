-- registry_hold: an identity an operator steered (a breaker forced, or reset), entered in the
-- registry by name whether or not a process uses it, so `caracal status` lists the state the
-- operator stored (marked unused while no process reports it), not only identities in use.
--
-- KEYS[1]  the registry's hash of the identity, `caracal:v1:{<namespace>}:entries:<xx>` (the
--          registry's prefix followed by the first two hex digits of its tag, see
--          registry_prelude.lua): this writes the description in the identity's head only (a
--          new head has no reporter and no values, so a reader tells an identity no process
--          reported by its missing values)
-- KEYS[2]  expiry sorted set `caracal:v1:{<namespace>}:entries:expiry`
-- KEYS[3]  the earlier layouts' (registry_prelude.lua), in this order: the eight-field hash of
--          the identity `…:identities:<xx>` and KEYS[4] its expiry set `…:identities:expiry`;
--          KEYS[5] the single hash `…:registry` and KEYS[6] its expiry set `…:registry:expiry`.
--          An earlier CLI's hold there (a description, no values) is removed from both: a
--          force without end would otherwise stay listed past this one's reset. An earlier
--          process's report there (values) is kept, its expiry only shortened to this hold's
--          (so an earlier CLI's force without end of it goes too); that process's next report
--          moves it later again
-- ARGV     1 the identity's tag, 2 its description, 3 how long the stored state lasts (ms),
--          4 how long processes' reports count as recent (ms, the drift window)
-- Reply    the server's time (ms)
-- TTL      listed until the stored state ends: set to exactly that when no process reported
--          the identity within the window (a reset after an indefinite force shortens it),
--          else only moved later (the processes' reports keep it as long as they need).
--          Past the registry's bound the soonest to expire go first (registry_report.lua).
-- Cost     O(log M) among M identities kept (per earlier layout one HEXISTS, then one HDEL
--          and one ZREM, or one ZADD).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expiry = KEYS[2]
local tag, description, lasts, drift_ms = ARGV[1], ARGV[2], tonumber(ARGV[3]),
  tonumber(ARGV[4])
local hash = KEYS[1]
local seen = redis.call('HGET', hash, tag)
local t, x, f, n, r, v, w = 0, 0, '0', 0, '', '', ''
if seen then
  -- One this version cannot read is entered again.
  t, x, f, n, r, v, w = parts_of(seen)
  if not t then
    t, x, f, n, r, v, w = 0, 0, '0', 0, '', '', ''
  end
end
redis.call('HSET', hash, tag, head_of(t, x, f, n, r, v, w, description))
local names = earlier_names(tag)
for _, earlier in ipairs({{KEYS[3], KEYS[4]}, {KEYS[5], KEYS[6]}}) do
  if redis.call('HEXISTS', earlier[1], tag .. ':v') == 0 then
    -- An earlier CLI's hold (a description, no values): this one replaces it.
    redis.call('HDEL', earlier[1], unpack(names))
    redis.call('ZREM', earlier[2], tag)
  else
    -- An earlier process's report: kept, with its uses and drift; only an earlier CLI's
    -- longer hold of it (a force without end) is cut to this one's, and that process's
    -- next report moves it later again as it needs.
    redis.call('ZADD', earlier[2], 'XX', 'LT', now + math.max(lasts, drift_ms), tag)
  end
end
if now - t < drift_ms then
  redis.call('ZADD', expiry, 'GT', now + lasts, tag)
else
  redis.call('ZADD', expiry, now + lasts, tag)
end
return now
