-- bulkhead_lease: take or renew one lease in a bulkhead's lease set.
--
-- KEYS[1]  the lease set `caracal:v1:{<identity>}:leases`: a sorted set of token -> deadline
--          (absolute server milliseconds). Same layout and semantics as @gkoos/caracal, so Rust
--          and TypeScript replicas can share one budget.
-- ARGV[1]  action: "acquire" or "renew"
-- ARGV[2]  token (a UUID, unique per acquisition)
-- ARGV[3]  lease ttl in milliseconds
-- ARGV[4]  limit
-- Reply    {allowed, occupancy}: allowed is 1 when the token holds a lease afterwards; occupancy
--          is the number of live leases afterwards.
--          acquire: admits when fewer than limit are live; an already-held token is admitted
--          again without extending its deadline (idempotent).
--          renew: pushes a held token's deadline to now + ttl; 0 when it is gone.
--          Release is a plain ZREM of the token, outside this script.
-- TTL      PEXPIREAT at the latest live deadline, so the key disappears once no lease can
--          matter. A deadline equal to now counts as expired.
-- Cost     O(log N + E): N live leases (at most limit), E expired ones pruned.
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local key = KEYS[1]
local token = ARGV[2]

redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local held = redis.call('ZSCORE', key, token)
local count = redis.call('ZCARD', key)

if ARGV[1] == 'renew' then
  if not held then
    return {0, count}
  end
elseif held then
  return {1, count}
elseif count >= tonumber(ARGV[4]) then
  return {0, count}
else
  count = count + 1
end

local deadline = now + tonumber(ARGV[3])
redis.call('ZADD', key, deadline, token)
local latest = redis.call('ZRANGE', key, 0, 0, 'REV', 'WITHSCORES')
redis.call('PEXPIREAT', key, math.max(deadline, tonumber(latest[2])))
return {1, count}
