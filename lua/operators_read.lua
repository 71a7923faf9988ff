-- operators_read: the operator records of a namespace (who forced a breaker, who set an
-- override, and why), for `caracal status` and `caracal config get`, or those of a few fields
-- (a process announcing a change an operator made). See `coordinator/operators.rs`.
--
-- KEYS[1]  operator records hash `caracal:v1:{<namespace>}:operators`: field -> JSON record
-- ARGV     the fields to read; none for every field
-- Reply    {field, record, field, record, …}, for the fields that hold a record
-- TTL      reads only.
-- Cost     O(N) for N fields asked for (or held).
if #ARGV == 0 then
  return redis.call('HGETALL', KEYS[1])
end
local reply = {}
local records = redis.call('HMGET', KEYS[1], unpack(ARGV))
for i, field in ipairs(ARGV) do
  if records[i] then
    reply[#reply + 1] = field
    reply[#reply + 1] = records[i]
  end
end
return reply
