-- Redis Cluster only: one global-index write, inside one index shard (every key carries the
-- shard's {idx:<n>} hash tag). Idempotent and order-independent, so the store may repeat it for
-- an update that was already applied (a redelivery after a crash between the run's write and
-- this one).
-- ARGV[1] = 'status': KEYS 1 the shard's run -> "offset STATUS" hash, 2.. the shard's by-status
--   sorted sets; ARGV 2 run id, 3 the update's log offset, 4 the new status, 5 updated_at,
--   6.. the status names of KEYS[2..] in order. Moves the run to the new status's set unless the
--   shard already indexed a newer offset of it. Returns 1 moved, 0 older than what is indexed.
-- ARGV[1] = 'effect': KEYS 1 the shard's delivery key -> effect hash; ARGV 2 delivery key,
--   3 effect JSON, 4 sort key. Keeps the entry with the smallest sort key, compared bytewise
--   (as apply.lua does). Returns 1 written, 0 kept.
-- #include _effect_index.lua
if ARGV[1] == 'status' then
  local key_of = {}
  for j = 6, #ARGV do key_of[ARGV[j]] = KEYS[j - 4] end
  local held = redis.call('HGET', KEYS[1], ARGV[2])
  local offset = tonumber(ARGV[3])
  if held then
    local sp = string.find(held, ' ', 1, true)
    if tonumber(string.sub(held, 1, sp - 1)) > offset then return 0 end
    local old = key_of[string.sub(held, sp + 1)]
    if old and old ~= key_of[ARGV[4]] then redis.call('ZREM', old, ARGV[2]) end
  end
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3] .. ' ' .. ARGV[4])
  redis.call('ZADD', key_of[ARGV[4]], tonumber(ARGV[5]), ARGV[2])
  return 1
end
return index_effect(KEYS[1], ARGV[2], ARGV[3], ARGV[4])
