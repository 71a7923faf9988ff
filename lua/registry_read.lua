-- registry_read: the identities a namespace's processes use (see registry_report.lua), for
-- `caracal status`.
--
-- KEYS[1]  the prefix of the registry's hashes: `caracal:v1:{<namespace>}:entries:` (an
--          identity's head and uses, as registry_prelude.lua lays them out, in the hash named
--          by its tag's first ARGV[3] hex digits), or an earlier version's, which a reader
--          lists after the current one while processes of those versions may still write it:
--          `…:identities:` (eight fields per identity, `<tag>:d` `:v` `:w` `:x` `:u` read) or
--          the single hash `…:registry` (the same fields, ARGV[3] = 0)
-- KEYS[2]  expiry sorted set `caracal:v1:{<namespace>}:entries:expiry` (or
--          `…:identities:expiry`, `…:registry:expiry`)
-- ARGV[1]  where this page starts, by rank from the last to expire (0 for the first page)
-- ARGV[2]  how many identities the page holds at most
-- ARGV[3]  how many of a tag's first hex digits name its hash: 2, or 0 (the single hash)
-- ARGV[4]  the layout: `head` (registry_prelude.lua's) or `fields` (the earlier versions')
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
local packed = ARGV[4] == 'head'
-- A rank is found in O(log M), where an offset into a score range is walked to.
local ranked = redis.call('ZRANGE', expiry, start, start + count - 1, 'REV', 'WITHSCORES')
local tags = {}
for i = 1, #ranked, 2 do
  if tonumber(ranked[i + 1]) <= now then
    break
  end
  tags[#tags + 1] = ranked[i]
end

-- An entry's description, values, sources, drift-noticed-until (ms) and uses, or nothing.
local function entry(hash, tag)
  if packed then
    local seen = redis.call('HMGET', hash, tag, tag .. ':u')
    if not seen[1] then
      return nil
    end
    local _, x, _, _, _, v, w, d = parts_of(seen[1])
    return d, v, w, x, seen[2]
  end
  local seen = redis.call('HMGET', hash, tag .. ':d', tag .. ':v', tag .. ':w', tag .. ':x',
    tag .. ':u')
  return seen[1], seen[2], seen[3], tonumber(seen[4]), seen[5]
end

local reply = {now, #tags < count and -1 or start + #tags}
for _, tag in ipairs(tags) do
  local d, v, w, x, u = entry(registry .. string.sub(tag, 1, digits), tag)
  if d then
    reply[#reply + 1] = tag
    reply[#reply + 1] = d
    reply[#reply + 1] = v or ''
    reply[#reply + 1] = w or ''
    reply[#reply + 1] = (x or 0) > now and 1 or 0
    reply[#reply + 1] = u or '{}'
  end
end
return reply
