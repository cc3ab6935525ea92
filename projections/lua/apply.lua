-- Apply one run update atomically, guarded by the run's last folded log offset (compare-and-set).
-- KEYS: 1 state hash, 2 checkpoints zset, 3 effects hash, 4 index of the base status,
--       5 index of the new status, 6 global effects-by-delivery-key hash, 7 the namespace marker
-- ARGV: base_offset, new_offset, run_id, updated_at, n_fields, field/value pairs...,
--       n_checkpoints, score/member pairs..., n_effects, delivery_key/json/sort_key triples...,
--       generation
-- The run's effects hash takes every effect; the global index (KEYS[6]) keeps, per delivery key,
-- the entry with the smallest sort key (done beats open, then the earliest opened, then run id;
-- compared bytewise, never with the server's locale), so its winner does not depend on the order
-- in which runs are applied. An indexed value without a sort key (written before it existed) is
-- replaced.
-- Returns 1 applied, 0 already applied (stored offset >= new), -1 conflict (stored != base),
-- -2 lost: the marker does not hold the writer's generation (Redis was emptied, or the
-- namespace replaced, under the writer), so nothing is written.
if redis.call('HGET', KEYS[7], 'gen') ~= ARGV[#ARGV] then return -2 end
-- a <= b, byte by byte (Lua's own string comparison follows the server's LC_COLLATE)
local function not_after(a, b)
  local n = math.min(#a, #b)
  for j = 1, n do
    local x, y = string.byte(a, j), string.byte(b, j)
    if x ~= y then return x < y end
  end
  return #a <= #b
end
local function indexed_key(raw)
  if not raw then return nil end
  local ok, d = pcall(cjson.decode, raw)
  if ok and type(d) == 'table' and type(d['sort_key']) == 'string' then return d['sort_key'] end
  return nil
end
local cur = tonumber(redis.call('HGET', KEYS[1], 'offset') or '-1')
local base = tonumber(ARGV[1])
local new = tonumber(ARGV[2])
if cur >= new then return 0 end
if cur ~= base then return -1 end
local i = 6
local n = tonumber(ARGV[5])
local fields = {}
for j = 1, 2 * n do fields[j] = ARGV[i + j - 1] end
i = i + 2 * n
redis.call('HSET', KEYS[1], unpack(fields))
if KEYS[4] ~= KEYS[5] then redis.call('ZREM', KEYS[4], ARGV[3]) end
redis.call('ZADD', KEYS[5], tonumber(ARGV[4]), ARGV[3])
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('ZADD', KEYS[2], tonumber(ARGV[i]), ARGV[i + 1])
  i = i + 2
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  local held = indexed_key(redis.call('HGET', KEYS[6], ARGV[i]))
  if held == nil or not_after(ARGV[i + 2], held) then
    redis.call('HSET', KEYS[6], ARGV[i], ARGV[i + 1])
  end
  i = i + 3
end
return 1
