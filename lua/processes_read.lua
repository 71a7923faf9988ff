-- processes_read: the processes reporting to a namespace (see registry_report.lua), for
-- `caracal processes`.
--
-- KEYS[1]  processes hash `caracal:v1:{<namespace>}:processes`
-- KEYS[2]  its expiry sorted set `caracal:v1:{<namespace>}:processes:expiry`
-- ARGV[1]  the most processes listed
-- Reply    {now_ms, then 3 per live process: id, record (JSON), last report (ms)}, the soonest
--          to be forgotten first
-- TTL      reads only.
-- Cost     O(log M + P) for P processes listed among M kept.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local processes, expiry = KEYS[1], KEYS[2]
local reply = {now}
for _, id in ipairs(redis.call('ZRANGE', expiry, '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0,
    tonumber(ARGV[1]))) do
  local seen = redis.call('HMGET', processes, id, id .. ':t')
  if seen[1] then
    reply[#reply + 1] = id
    reply[#reply + 1] = seen[1]
    reply[#reply + 1] = tonumber(seen[2]) or 0
  end
end
return reply
