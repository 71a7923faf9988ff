-- bulkhead_lease: take or renew one lease in a bulkhead's lease set.
--
-- KEYS[1]  the lease set `caracal:v1:{<identity>}:leases`: a sorted set of token -> deadline
--          (absolute server milliseconds). Same layout and semantics as @gkoos/caracal, so Rust
--          and TypeScript replicas can share one budget.
-- ARGV[1]  action: "acquire" or "renew"
-- ARGV[2]  token (a UUID, unique per acquisition)
-- ARGV[3]  lease ttl in milliseconds
-- ARGV[4]  limit
-- Reply    {allowed, occupancy}: allowed is 1 when the token holds a lease afterwards;
--          occupancy is the size of the set afterwards (leases that expired but were not
--          needed yet may still be counted).
--          acquire: admits when fewer than limit are live; an already-held token is admitted
--          again without extending its deadline (idempotent).
--          renew: pushes a live token's deadline to now + ttl; 0 when it is gone or expired.
--          Release is a plain ZREM of the token, outside this script.
-- TTL      the key expires at its latest deadline (never earlier): set outright on a new key,
--          pushed later with GT otherwise.
-- Cost     admission below the limit is 4 commands; expired leases (deadline <= now) are
--          pruned only when the set looks full, so at most `limit` members ever wait to be
--          pruned. O(log N + E), N <= limit.
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local key, token = KEYS[1], ARGV[2]
local deadline = now + tonumber(ARGV[3])

if ARGV[1] == 'renew' then
  local held = tonumber(redis.call('ZSCORE', key, token))
  if not held or held <= now then
    if held then redis.call('ZREM', key, token) end
    return {0, redis.call('ZCARD', key)}
  end
  redis.call('ZADD', key, deadline, token)
  redis.call('PEXPIREAT', key, deadline, 'GT')
  return {1, redis.call('ZCARD', key)}
end

local count = redis.call('ZCARD', key)
if count >= tonumber(ARGV[4]) then
  count = count - redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if count >= tonumber(ARGV[4]) then
    -- Full; but a token that already holds a lease keeps it.
    return {redis.call('ZSCORE', key, token) and 1 or 0, count}
  end
end
if redis.call('ZADD', key, 'NX', deadline, token) == 0 then
  -- Already held: admitted again, deadline unchanged; unless it had expired unpruned, in which
  -- case this is a new lease.
  if tonumber(redis.call('ZSCORE', key, token)) > now then
    return {1, count}
  end
  redis.call('ZADD', key, deadline, token)
  redis.call('PEXPIREAT', key, deadline, 'GT')
  return {1, count}
end
if count == 0 then
  redis.call('PEXPIREAT', key, deadline)
else
  redis.call('PEXPIREAT', key, deadline, 'GT')
end
return {1, count + 1}
