-- bulkhead_lease: take leases for one or more tokens, or renew one, in a bulkhead's lease set;
-- every lease granted gets a fencing token. The same steps as `LeaseSet` in the Rust kernel
-- (caracal/src/kernel/lease.rs).
--
-- KEYS[1]  the lease set `caracal:v1:{<identity>}:leases`: a sorted set of token -> deadline
--          (absolute server milliseconds). Same layout and semantics as @gkoos/caracal, so Rust
--          and TypeScript replicas can share one budget.
-- KEYS[2]  the fencing counter `caracal:v1:{<identity>}:fence`: the last fencing token granted.
-- ARGV[1]  action: "acquire" or "renew"
-- ARGV[2]  lease ttl in milliseconds
-- ARGV[3]  limit
-- ARGV[4]  the highest fencing token the caller knows to be live in this set (the fence of a
--          lease it still trusts), 0 when it knows none
-- ARGV[5…] tokens (UUIDs, unique per acquisition): acquire takes one or more, each decided
--          as if alone at the same instant; renew takes exactly one
-- then     as many shares, one per token in the same order: the share of the limit its caller's
--          priority class may use, in thousandths (1000: the whole limit; a renewal's is not
--          read). An acquire is admitted only while fewer than its cap are live, cap =
--          ceil(limit * share / 1000) clamped to [min(1, limit), limit]. A batch decides its
--          tokens highest share first, tokens of one share in their order; replies stay in the
--          tokens' order.
-- Reply    per token, three integers {allowed, occupancy, fence}: allowed is 1 when the token
--          holds a lease afterwards; occupancy is the size of the set afterwards (leases that
--          expired but were not in the way may still be counted); fence is the token's fencing
--          token when a lease was granted, else 0.
--          acquire: admits when fewer than its cap are live; an already-held token is admitted
--          again without extending its deadline.
--          renew: pushes a live token's deadline to now + ttl; 0 when it is gone or expired.
--          Release is a plain ZREM of tokens, outside this script.
--          Refused whole, changing nothing: with the error CARACAL_LOST when the counter is
--          below ARGV[4] (the set was lost without a restart: a flush, an eviction, a deleted
--          key; so is every caller that knows a live token, until one that knows none is
--          granted), and with CARACAL_FENCE when granting would take the counter past
--          2^53 - 1 or the counter holds something else than such a number.
-- Fencing  every grant's fence is max(last + 1, now in microseconds): strictly increasing per
--          identity, and still so after the counter is lost (expiry, a restart without
--          persistence), because no grant runs ahead of the server clock. At most 2^53 - 1,
--          so that every token is exact as a Lua (or JSON, or JavaScript) number.
-- TTL      the lease set expires at its latest deadline (never earlier): set outright on a new
--          key, pushed later with GT otherwise. The counter lives one ttl past the latest
--          deadline it was granted or renewed with (never earlier), so that a caller's live
--          token always finds it.
-- Cost     an admission below its cap is 6 or 7 commands (TIME, GET, ZCARD, ZADD,
--          PEXPIREAT, SET, and PEXPIREAT GT on an existing counter); a batch that fits below the
--          limit is 8 whatever its size (one ZMSCORE and one ZADD for all its tokens), and one
--          that does not costs up to 2 more per token; a renewal is 6. Expired
--          leases (deadline <= now) are pruned only when the set looks full for the token's
--          class, so at most `limit` members ever wait to be pruned. O(T log N + E): T tokens,
--          N <= limit, E pruned (and T log T to order a batch of mixed shares).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local leases, fences = KEYS[1], KEYS[2]
local ttl = tonumber(ARGV[2])
local deadline = now + ttl
local limit = tonumber(ARGV[3])
local known = tonumber(ARGV[4])
local tokens = (#ARGV - 4) / 2
local MAX_FENCE = 9007199254740991

local stored = redis.call('GET', fences)
local counter = 0
if stored then
  counter = string.match(stored, '^%d+$') and tonumber(stored)
  if not counter or counter > MAX_FENCE then
    return redis.error_reply('CARACAL_FENCE the fencing counter ' .. fences .. ' holds ' ..
      string.sub(stored, 1, 40) .. ', not a token of at most 2^53 - 1')
  end
end
-- How the counter's expiry moves: outright for a new key, never earlier for an existing one.
local function keep_counter(value, until_ms)
  if stored then
    redis.call('SET', fences, string.format('%d', value), 'KEEPTTL')
    redis.call('PEXPIREAT', fences, until_ms, 'GT')
  else
    redis.call('SET', fences, string.format('%d', value), 'PXAT', until_ms)
  end
end
if known > counter then
  return redis.error_reply('CARACAL_LOST the lease set lost its keys without a restart: ' ..
    'the fencing counter was ' .. string.format('%d', counter) .. ', a live lease holds ' ..
    string.format('%d', known))
end

if ARGV[1] == 'renew' then
  local token = ARGV[5]
  local held = tonumber(redis.call('ZSCORE', leases, token))
  if not held or held <= now then
    if held then redis.call('ZREM', leases, token) end
    return {0, redis.call('ZCARD', leases), 0}
  end
  redis.call('ZADD', leases, deadline, token)
  redis.call('PEXPIREAT', leases, deadline, 'GT')
  if stored then redis.call('PEXPIREAT', fences, deadline + ttl, 'GT') end
  return {1, redis.call('ZCARD', leases), 0}
end

if math.max(counter, now * 1000) + tokens > MAX_FENCE then
  return redis.error_reply('CARACAL_FENCE the fencing counter ' .. fences ..
    ' would pass 2^53 - 1')
end
local fence = nil
local function grant()
  fence = math.max((fence or counter) + 1, now * 1000)
  return fence
end

-- Each token's cap, and the order the tokens are decided in: highest share first, ties in
-- their order (the kernel's stable sort).
local caps, order, mixed = {}, {}, false
for i = 1, tokens do
  local share = tonumber(ARGV[4 + tokens + i])
  local cap = math.floor((limit * share + 999) / 1000)
  caps[i] = math.min(math.max(cap, math.min(1, limit)), limit)
  order[i] = i
  mixed = mixed or share ~= tonumber(ARGV[5 + tokens])
end
if mixed then
  local function share(i) return tonumber(ARGV[4 + tokens + i]) end
  table.sort(order, function(a, b)
    local sa, sb = share(a), share(b)
    return sa > sb or (sa == sb and a < b)
  end)
end

local count = redis.call('ZCARD', leases)
-- How the set's expiry moves: 'new' when this script created the key (outright), 'later'
-- when a deadline was set on an existing one (GT), nil when no deadline changed.
local expiry = nil
local reply = {}

-- A batch whose every token finds the set below its cap needs no pruning, so its decisions
-- follow from the tokens' scores alone: read them with one ZMSCORE, write every new or relet
-- lease with one ZADD, and answer as the token-by-token loop below would. A command per token
-- is what makes a large batch slow; the loop is left for batches that reach the limit (and
-- for single tokens, where ZMSCORE would be one command more). Bounded so that `unpack`
-- stays within Lua's stack.
local function decide_batch()
  if tokens < 2 or tokens > 1000 then return false end
  local scores = redis.call('ZMSCORE', leases, unpack(ARGV, 5, 4 + tokens))
  local held, writes, counts = {}, {}, {}
  local planned_expiry, c = expiry, count
  for _, i in ipairs(order) do
    if c >= caps[i] then return false end
    local token = ARGV[i + 4]
    local until_ms = held[token] or tonumber(scores[i])
    if not until_ms then
      if c == 0 then planned_expiry = 'new' else planned_expiry = planned_expiry or 'later' end
      c = c + 1
    elseif until_ms <= now then
      planned_expiry = planned_expiry or 'later'
    end
    if not until_ms or until_ms <= now then
      held[token] = deadline
      writes[#writes + 1] = deadline
      writes[#writes + 1] = token
    end
    counts[i] = c
  end
  if #writes > 0 then redis.call('ZADD', leases, unpack(writes)) end
  expiry, count = planned_expiry, c
  for _, i in ipairs(order) do
    reply[3 * i - 2] = 1
    reply[3 * i - 1] = counts[i]
    reply[3 * i] = grant()
  end
  return true
end

if decide_batch() then order = {} end
for _, i in ipairs(order) do
  local token = ARGV[i + 4]
  local allowed, granted = 1, 0
  if count >= caps[i] then
    count = count - redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
  end
  if count >= caps[i] then
    -- Full; but a token that already holds a lease keeps it.
    if redis.call('ZSCORE', leases, token) then
      granted = grant()
    else
      allowed = 0
    end
  elseif redis.call('ZADD', leases, 'NX', deadline, token) == 1 then
    if count == 0 then expiry = 'new' else expiry = expiry or 'later' end
    count = count + 1
    granted = grant()
  else
    -- Already held: admitted again, deadline unchanged; unless it had expired unpruned, in
    -- which case this is a new lease.
    if tonumber(redis.call('ZSCORE', leases, token)) <= now then
      redis.call('ZADD', leases, deadline, token)
      expiry = expiry or 'later'
    end
    granted = grant()
  end
  reply[3 * i - 2] = allowed
  reply[3 * i - 1] = count
  reply[3 * i] = granted
end
if expiry == 'new' then
  redis.call('PEXPIREAT', leases, deadline)
elseif expiry == 'later' then
  redis.call('PEXPIREAT', leases, deadline, 'GT')
end
if fence then
  keep_counter(fence, deadline + ttl)
end
return reply
