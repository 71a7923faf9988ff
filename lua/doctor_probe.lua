-- doctor_probe: does the server run a script as one step, and can a script read TIME?
-- `caracal doctor` runs it on one connection while another connection writes KEYS[1]: on a
-- server that runs scripts atomically the write waits for the script, so the script reads the
-- same value before and after its busy loop. (The loop counts iterations, not time: a server
-- may give a script one frozen TIME for its whole run.)
--
-- KEYS[1]  the doctor's probe key (`caracal:v1:{doctor}:probe`)
-- ARGV[1]  how many empty iterations to spin (tens of milliseconds' worth)
-- Reply    {before, after, seconds, microseconds}: the key's value (false when unset) before
--          and after the loop, and TIME as the script saw it
-- TTL      reads only.
-- Cost     O(ARGV[1]) CPU, bounded by the caller (the only script of caracal that spins: run by
--          the doctor alone, never by the fleet).
local before = redis.call('GET', KEYS[1])
local spins = tonumber(ARGV[1])
local sum = 0
for i = 1, spins do
  sum = sum + i
end
local after = redis.call('GET', KEYS[1])
local time = redis.call('TIME')
return {before, after, time[1], time[2]}
