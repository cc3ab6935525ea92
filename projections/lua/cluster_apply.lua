-- Redis Cluster form of apply.lua: apply one run update to the run's own keys only (one slot:
-- every key carries the {run id} hash tag), guarded by the run's last folded log offset.
-- The global indexes (runs by status, effects by delivery key) are written afterwards, shard by
-- shard, by cluster_index.lua; the namespace marker is checked by the store before the batch.
-- KEYS: 1 state hash, 2 checkpoints zset, 3 effects hash
-- ARGV: base_offset, new_offset, run_id, updated_at, n_fields, field/value pairs..., call fields
--       to drop (n and names, or -1: every call field not set),
--       n_checkpoints, score/member pairs..., n_effects, delivery_key/json/sort_key triples...,
--       generation
-- Returns 1 applied, 0 already applied (stored offset >= new), -1 conflict (stored != base),
-- -2 lost: the writer computed the update from a stored state (base_offset >= 0) that is gone
-- (the node owning the run's slot came back empty), so nothing is written.
-- #include _run_write.lua
local stored = redis.call('HGET', KEYS[1], 'offset')
local base = tonumber(ARGV[1])
local new = tonumber(ARGV[2])
if not stored and base >= 0 then return -2 end
local cur = tonumber(stored or '-1')
if cur >= new then return 0 end
if cur ~= base then return -1 end
if calls_base_unknown(KEYS[1], cur) then return -1 end
write_run(KEYS[1], KEYS[2], KEYS[3])
return 1
