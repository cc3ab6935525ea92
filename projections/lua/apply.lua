-- Apply one run update atomically, guarded by the run's last folded log offset (compare-and-set).
-- KEYS: 1 state hash, 2 checkpoints zset, 3 effects hash, 4 index of the base status,
--       5 index of the new status, 6 global effects-by-delivery-key hash, 7 the namespace marker
-- ARGV: base_offset, new_offset, run_id, updated_at, n_fields, field/value pairs..., call fields
--       to drop (n and names, or -1: every call field not set),
--       n_checkpoints, score/member pairs..., n_effects, delivery_key/json/sort_key triples...,
--       generation
-- The run's effects hash takes every effect; the global index (KEYS[6]) keeps, per delivery key,
-- the winner of _effect_index.lua's rule, so it does not depend on the order in which runs are applied.
-- Returns 1 applied, 0 already applied (stored offset >= new), -1 conflict (stored != base),
-- -2 lost: the marker does not hold the writer's generation (Redis was emptied, or the
-- namespace replaced, under the writer), so nothing is written.
if redis.call('HGET', KEYS[7], 'gen') ~= ARGV[#ARGV] then return -2 end
-- #include _effect_index.lua
-- #include _run_write.lua
local cur = tonumber(redis.call('HGET', KEYS[1], 'offset') or '-1')
local base = tonumber(ARGV[1])
local new = tonumber(ARGV[2])
if cur >= new then return 0 end
if cur ~= base then return -1 end
if calls_base_unknown(KEYS[1], cur) then return -1 end
local i = write_run(KEYS[1], KEYS[2], KEYS[3])
if KEYS[4] ~= KEYS[5] then redis.call('ZREM', KEYS[4], ARGV[3]) end
redis.call('ZADD', KEYS[5], tonumber(ARGV[4]), ARGV[3])
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  index_effect(KEYS[6], ARGV[i], ARGV[i + 1], ARGV[i + 2])
  i = i + 3
end
return 1
