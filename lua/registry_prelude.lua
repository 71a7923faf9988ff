-- registry_prelude: not a script of its own. Sent in front of registry_report, registry_read
-- and registry_hold: how an identity's entry is laid out in the registry's hashes, read and
-- written by name from here.
--
-- An identity tagged T lives in the hash named by the registry's prefix followed by T's
-- first two hex digits (`caracal:v1:{<namespace>}:entries:00` to `…:ff`, in the namespace's
-- slot by its hash tag), in two fields:
--   `<T>`    its head: '<t> <x> <f> <n> <#r> <#v> <#w> ' then r, v, w and d end to end,
--            where t is when it was last reported (ms, 0 for none), x when the drift noticed
--            ends (ms), f the version of the fleet's overrides its reporter resolved its
--            values under, n how many processes `<T>:u` holds, r who reported it last
--            ("<process>/<call site>", empty when only an operator entered it), v its values
--            ("key=value …"), w where each value came from, and d its description (JSON
--            [kind, name, operation, scope]): three lengths rather than a separator, so any
--            text fits, and one field to read, write and forget rather than eight
--   `<T>:u`  JSON {process: [values, ms, extra]}: each process's values as it last reported
--            them and what it added, kept while drift stays noticed
-- (Earlier versions kept eight fields per identity, EARLIER_FIELDS below, in
-- `…:identities:00`–`ff`, and before that in the single hash `…:registry`: still read, and
-- emptied as they expire, while processes of those versions write them; but for the retry
-- budgets this version reports, written in `…:identities:` too, each forgotten its ttl after
-- its last report, within the registry's bound: see registry_report.lua.)
-- KEYS     none of its own
-- ARGV     none of its own
-- Reply    none of its own
-- TTL      none of its own
-- Cost     O(1) per head read or written (three lengths, no scan for a separator).

-- The head of an entry, from its parts.
local function head_of(t, x, f, n, r, v, w, d)
  return t .. ' ' .. x .. ' ' .. f .. ' ' .. n .. ' ' .. #r .. ' ' .. #v .. ' ' .. #w .. ' '
    .. r .. v .. w .. d
end

-- A head's parts: t, x, f, n, r, v, w, d (t, x and n numbers, f as written); nothing for
-- one this version cannot read.
local function parts_of(head)
  local t, x, f, n, lr, lv, lw, at =
    string.match(head, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) ()')
  if not at then
    return nil
  end
  local v_at = at + tonumber(lr)
  local w_at = v_at + tonumber(lv)
  local d_at = w_at + tonumber(lw)
  return tonumber(t), tonumber(x), f, tonumber(n), string.sub(head, at, v_at - 1),
    string.sub(head, v_at, w_at - 1), string.sub(head, w_at, d_at - 1), string.sub(head, d_at)
end

-- The suffixes of the eight fields an identity tagged T had in the earlier layouts: `<T>:d`
-- its description, `:v` values, `:w` sources, `:r` reporter, `:t` when reported (ms), `:x`
-- drift noticed until (ms), `:f` the fleet overrides' version and `:u` the processes' map.
local EARLIER_FIELDS = {':d', ':v', ':w', ':r', ':t', ':x', ':f', ':u'}

-- The names of the earlier layouts' fields of the identity tagged `tag`.
local function earlier_names(tag)
  local names = {}
  for i, suffix in ipairs(EARLIER_FIELDS) do
    names[i] = tag .. suffix
  end
  return names
end
