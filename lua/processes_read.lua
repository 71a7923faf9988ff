-- processes_read: a page of the processes reporting to a namespace (see registry_report.lua),
-- for `caracal processes`.
--
-- KEYS[1]  processes hash `caracal:v1:{<namespace>}:processes`
-- KEYS[2]  its expiry sorted set `caracal:v1:{<namespace>}:processes:expiry`
-- ARGV[1]  where this page starts, by rank from the last to be forgotten (0 for the first page)
-- ARGV[2]  how many processes the page holds at most
-- Reply    {now_ms, next (where the next page starts, or -1 after the last), then 3 per live
--          process: id, record (JSON), last report (ms)}, the last to be forgotten first
-- TTL      reads only.
-- Cost     O(log M + P) for a page of P among M processes kept, wherever the page starts (by
--          rank; the expired ones not yet forgotten rank last): a reader pages through a
--          large fleet without holding the server for long (a process that reports between
--          two pages may be listed twice or missed once).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local processes, expiry = KEYS[1], KEYS[2]
local start, count = tonumber(ARGV[1]), tonumber(ARGV[2])
local ranked = redis.call('ZRANGE', expiry, start, start + count - 1, 'REV', 'WITHSCORES')
local ids = {}
for i = 1, #ranked, 2 do
  if tonumber(ranked[i + 1]) <= now then
    break
  end
  ids[#ids + 1] = ranked[i]
end
local reply = {now, #ids < count and -1 or start + #ids}
for _, id in ipairs(ids) do
  local seen = redis.call('HMGET', processes, id, id .. ':t')
  if seen[1] then
    reply[#reply + 1] = id
    reply[#reply + 1] = seen[1]
    reply[#reply + 1] = tonumber(seen[2]) or 0
  end
end
return reply
