-- Redis Cluster: one slot's share of a namespace swap (projections/_cluster_swap.py), all or
-- nothing: every key below lies in one slot (the names carry their run's or shard's hash tag).
-- KEYS: 1 the slot's journal (under the backup prefix), then three keys per name: the name under
--   the live, the rebuilt and the backup prefix.
-- ARGV: 1 'in' or 'back', then one flag per name: '1' the rebuilt namespace has it (it moves in),
--   '0' only the live namespace has it (it moves out).
-- 'in': checks first, writes after, so a refusal writes nothing: it refuses (an error reply)
--   when the journal is set (the slot was moved already), a backup key exists, or a rebuilt key
--   that should move in is missing. Then renames each live key to its backup, each rebuilt key
--   into the live namespace, and sets the journal. Returns how many keys moved in.
-- 'back': undoes 'in' exactly when the journal is set (the moved-in keys back to the rebuilt
--   namespace, the backups back to the live one) and deletes the journal; does nothing without
--   it. Returns 1 undone, 0 nothing to undo. Running it again changes nothing: a lost reply is
--   answered by running it again.
local n = (#KEYS - 1) / 3
if ARGV[1] == 'in' then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return redis.error_reply('SWAP slot already moved: ' .. KEYS[1])
  end
  for j = 0, n - 1 do
    local live, rebuilt, backup = KEYS[2 + 3 * j], KEYS[3 + 3 * j], KEYS[4 + 3 * j]
    if redis.call('EXISTS', backup) == 1 then
      return redis.error_reply('SWAP backup key exists: ' .. backup)
    end
    if ARGV[2 + j] == '1' and redis.call('EXISTS', rebuilt) == 0 then
      return redis.error_reply('SWAP rebuilt key missing: ' .. rebuilt)
    end
  end
  local moved = 0
  for j = 0, n - 1 do
    local live, rebuilt, backup = KEYS[2 + 3 * j], KEYS[3 + 3 * j], KEYS[4 + 3 * j]
    if redis.call('EXISTS', live) == 1 then redis.call('RENAME', live, backup) end
    if ARGV[2 + j] == '1' then
      redis.call('RENAME', rebuilt, live)
      moved = moved + 1
    end
  end
  redis.call('SET', KEYS[1], '1')
  return moved
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for j = 0, n - 1 do
  local live, rebuilt, backup = KEYS[2 + 3 * j], KEYS[3 + 3 * j], KEYS[4 + 3 * j]
  if ARGV[2 + j] == '1' and redis.call('EXISTS', live) == 1 then redis.call('RENAME', live, rebuilt) end
  if redis.call('EXISTS', backup) == 1 then redis.call('RENAME', backup, live) end
end
redis.call('DEL', KEYS[1])
return 1
