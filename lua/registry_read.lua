-- registry_read: the identities a namespace's processes use (see registry_report.lua), for
-- `caracal status`.
--
-- KEYS[1]  the registry's hashes' common prefix `caracal:v1:{<namespace>}:identities:` (the
--          identity tagged T lives in the hash named KEYS[1] followed by T's first ARGV[3] hex
--          digits), or the single hash earlier versions kept every identity in,
--          `caracal:v1:{<namespace>}:registry` (ARGV[3] = 0), which a reader lists after the
--          current one while processes of those versions may still write it
-- KEYS[2]  expiry sorted set `caracal:v1:{<namespace>}:identities:expiry` (or
--          `…:registry:expiry`)
-- ARGV[1]  where this page starts, by rank from the last to expire (0 for the first page)
-- ARGV[2]  how many identities the page holds at most
-- ARGV[3]  how many of a tag's first hex digits name its hash: 2 (registry_report.lua's
--          256 hashes), or 0 (the earlier versions' single hash)
-- Reply    {now_ms, next (where the next page starts, or -1 after the last), then 6 per live
--          identity: tag, description, values, sources, drift (0/1), and each process's values
--          and what it added (JSON {process: [values, ms, extra]}, as registry_report.lua keeps
--          it)}, the last to expire first (those the registry's bound keeps longest: a reader
--          that stops at the bound lists those)
-- TTL      reads only.
-- Cost     O(log M + P) for a page of P among M identities kept, wherever the page starts (by
--          rank; the expired ones not yet forgotten rank last): a reader pages through a
--          large registry without holding the server for long (identities reported between
--          two pages may be listed twice or missed once).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local registry, expiry = KEYS[1], KEYS[2]
local start, count, digits = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
-- A rank is found in O(log M), where an offset into a score range is walked to.
local ranked = redis.call('ZRANGE', expiry, start, start + count - 1, 'REV', 'WITHSCORES')
local tags = {}
for i = 1, #ranked, 2 do
  if tonumber(ranked[i + 1]) <= now then
    break
  end
  tags[#tags + 1] = ranked[i]
end
local reply = {now, #tags < count and -1 or start + #tags}
for _, tag in ipairs(tags) do
  local seen = redis.call('HMGET', registry .. tag:sub(1, digits), tag .. ':d', tag .. ':v',
    tag .. ':w', tag .. ':x', tag .. ':u')
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
