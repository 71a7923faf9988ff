-- registry_read: the identities a namespace's processes use (see registry_report.lua), for
-- `caracal status`.
--
-- KEYS[1]  registry hash `caracal:v1:{<namespace>}:registry`
-- KEYS[2]  expiry sorted set `caracal:v1:{<namespace>}:registry:expiry`
-- ARGV     none
-- Reply    {now_ms, then 5 per live identity: tag, description, values, sources, drift (0/1)}
--          in tag order
-- TTL      reads only.
-- Cost     O(M) for M identities kept.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local registry, expiry = KEYS[1], KEYS[2]
local reply = {now}
for _, tag in ipairs(redis.call('ZRANGE', expiry, '(' .. now, '+inf', 'BYSCORE')) do
  local seen = redis.call('HMGET', registry, tag .. ':d', tag .. ':v', tag .. ':w', tag .. ':x')
  if seen[1] then
    reply[#reply + 1] = tag
    reply[#reply + 1] = seen[1]
    reply[#reply + 1] = seen[2] or ''
    reply[#reply + 1] = seen[3] or ''
    reply[#reply + 1] = (tonumber(seen[4]) or 0) > now and 1 or 0
  end
end
return reply
