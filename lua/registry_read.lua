-- registry_read: the identities a namespace's processes use (see registry_report.lua), for
-- `caracal status`.
--
-- KEYS[1]  registry hash `caracal:v1:{<namespace>}:registry`
-- KEYS[2]  expiry sorted set `caracal:v1:{<namespace>}:registry:expiry`
-- ARGV[1]  where this page starts among the live identities (0 for the first page)
-- ARGV[2]  how many identities the page holds at most
-- Reply    {now_ms, next (where the next page starts, or -1 after the last), then 6 per live
--          identity: tag, description, values, sources, drift (0/1), and each process's values
--          and what it added (JSON {process: [values, ms, extra]}, as registry_report.lua keeps
--          it)}, soonest to expire
--          first
-- TTL      reads only.
-- Cost     O(log M + P) for a page of P among M identities kept: a reader pages through a
--          large registry without holding the server for long (identities reported between
--          two pages may be listed twice or missed once).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local registry, expiry = KEYS[1], KEYS[2]
local start, count = tonumber(ARGV[1]), tonumber(ARGV[2])
local tags = redis.call('ZRANGE', expiry, '(' .. now, '+inf', 'BYSCORE', 'LIMIT', start, count)
local reply = {now, #tags < count and -1 or start + #tags}
for _, tag in ipairs(tags) do
  local seen = redis.call('HMGET', registry, tag .. ':d', tag .. ':v', tag .. ':w', tag .. ':x',
    tag .. ':u')
  if seen[1] then
    reply[#reply + 1] = tag
    reply[#reply + 1] = seen[1]
    reply[#reply + 1] = seen[2] or ''
    reply[#reply + 1] = seen[3] or ''
    reply[#reply + 1] = (tonumber(seen[4]) or 0) > now and 1 or 0
    reply[#reply + 1] = seen[5] or '{}'
  end
end
return reply
