-- acl_check: which commands caracal needs does the server not know (renamed or disabled with
-- `rename-command`), and which may the current user not run on caracal's keys and channel?
-- `connect()` runs it once, so a missing command or grant is a clear error at start-up rather
-- than a policy that silently misbehaves (no ZREM: releases never land; no HMGET: a breaker never
-- opens; no TIME: every script fails).
--
-- KEYS[1]  a key in caracal's key space (`caracal:v1:{…}:…`)
-- ARGV[1]  the namespace's pub/sub channel for breaker transitions
-- Reply    {denied, unknown, clock}: the commands the user may not run and those the server
--          does not know, each as "COMMAND" (two empty arrays when everything is there and
--          allowed); clock, "" when a script read TIME, else the server's error (every caracal
--          script decides on the server's clock: a server whose scripts cannot read it can
--          carry none of them)
-- TTL      touches no key.
-- Cost     O(1): one permission check per command.
local key, channel = KEYS[1], ARGV[1]
local needed = {
  -- sent by the client
  {'EVALSHA', '0000000000000000000000000000000000000000', '1', key},
  {'EVAL', 'return 0', '1', key},
  {'ZREM', key, 'token'},
  {'INFO', 'server'},
  {'SUBSCRIBE', channel},
  -- run inside the scripts
  {'TIME'},
  {'ZSCORE', key, 'token'},
  {'ZMSCORE', key, 'token'},
  {'ZCARD', key},
  {'ZADD', key, '1', 'token'},
  {'ZRANGE', key, '0', '0'},
  {'ZCOUNT', key, '0', '1'},
  {'ZREMRANGEBYSCORE', key, '-inf', '1'},
  {'PEXPIREAT', key, '1'},
  {'PERSIST', key},
  {'GET', key},
  {'SET', key, '1'},
  {'DEL', key},
  {'HMGET', key, 'field'},
  {'HSET', key, 'field', '1'},
  {'HDEL', key, 'field'},
  {'HGETALL', key},
  {'LINDEX', key, '0'},
  {'LPOP', key},
  {'RPUSH', key, 'entry'},
  {'LSET', key, '0', 'entry'},
  {'LLEN', key},
  {'PUBLISH', channel, 'message'},
}
local denied, unknown = {}, {}
for _, command in ipairs(needed) do
  -- A command the server does not know is an error here, not a refusal.
  local known, allowed = pcall(redis.acl_check_cmd, unpack(command))
  if not known then
    unknown[#unknown + 1] = command[1]
  elseif not allowed then
    denied[#denied + 1] = command[1]
  end
end
local read, clock = pcall(redis.call, 'TIME')
if read then
  clock = ''
elseif type(clock) == 'table' then
  clock = tostring(clock.err)
else
  clock = tostring(clock)
end
return {denied, unknown, clock}
