-- acl_check: which commands caracal needs may the current user not run on caracal's keys and
-- channel? `connect()` runs it once, so a missing grant is a clear error at start-up rather than
-- a policy that silently misbehaves (no ZREM: releases never land; no HMGET: a breaker never
-- opens).
--
-- KEYS[1]  a key in caracal's key space (`caracal:v1:{…}:…`)
-- ARGV[1]  the namespace's pub/sub channel for breaker transitions
-- Reply    the denied commands, as "COMMAND" (an empty array when everything is allowed)
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
local denied = {}
for _, command in ipairs(needed) do
  if not redis.acl_check_cmd(unpack(command)) then
    denied[#denied + 1] = command[1]
  end
end
return denied
