-- The rate limit's give-back: a process returns emissions it took ahead (prefetch) and will not
-- hand out. Same decision as `GiveBack` in the Rust kernel beside this file (give_back.rs).
-- Sent after prelude.lua, which reads the clock and the stored TAT.
--
-- KEYS[1]  the TAT (see prelude.lua)
-- ARGV[1]  emission interval in nanoseconds (integer >= 1)
-- ARGV[2]  how many emissions to give back: the last ones the process took
-- ARGV[3]  seconds, ARGV[4] nanoseconds: the TAT the process's take left
-- Reply    {1} when the TAT is still the one given (no emission was taken since, by anyone):
--          it moves back by that many intervals (the key goes when that is not after now);
--          {0}, changing nothing, otherwise: the emissions then expire unused.
-- TTL      PXAT at the new TAT, as admit.lua sets it.
-- Cost     O(1): 3 commands (TIME, GET, SET or DEL).
local interval, count = tonumber(ARGV[1]), tonumber(ARGV[2])
local left_s, left_ns = tonumber(ARGV[3]), tonumber(ARGV[4])
if stored_s ~= left_s or stored_ns ~= left_ns then
  return {0}
end
store(shifted(left_s, left_ns, -interval * count))
return {1}
