-- doctor_write: are PEXPIREAT … GT honoured and PEXPIRETIME readable, as the lease set's TTL
-- rule needs?
--
-- KEYS[1]  the doctor's probe key (`caracal:v1:{doctor}:probe`)
-- ARGV     none
-- Reply    {deadline, expiretime}: the deadline set (server ms), and PEXPIRETIME's answer
--          after a lower `PEXPIREAT … GT` (the same deadline when GT is honoured; false when
--          the user may not run PEXPIRETIME: caracal itself does not)
-- TTL      the probe key lives 10 s.
-- Cost     O(1).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local deadline = now + 10000
redis.call('SET', KEYS[1], 'doctor')
redis.call('PEXPIREAT', KEYS[1], deadline)
redis.call('PEXPIREAT', KEYS[1], now + 5000, 'GT')
local expiretime = redis.pcall('PEXPIRETIME', KEYS[1])
if type(expiretime) ~= 'number' then
  expiretime = false
end
return {deadline, expiretime}
