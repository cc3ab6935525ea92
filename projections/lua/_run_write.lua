-- (included) Write one run update to the run's own keys, shared by apply.lua and
-- cluster_apply.lua. ARGV from 5: n_fields, field/value pairs..., then the call fields to drop:
-- n_dropped and their names, or -1 (a whole write: every "call:" field the update does not set),
-- then n_checkpoints, score/member pairs..., n_effects, delivery_key/json/sort_key triples...
-- Returns the ARGV index of n_effects (the caller's index writes read the effect triples from
-- there).
-- Whether an update that sends only its changed calls (n_dropped >= 0) meets a stored run whose
-- calls are not kept apart (the earlier layout, calls inside the snapshot; or a hash a failover
-- took back to it): writing it would lose every unchanged call, so the caller answers CONFLICT and
-- the writer reloads the run and writes it whole.
local function calls_base_unknown(state, cur)
  if cur < 0 then return false end
  local d = tonumber(ARGV[6 + 2 * tonumber(ARGV[5])])
  return d >= 0 and redis.call('HGET', state, 'calls') ~= 'apart'
end

local function write_run(state, checkpoints, effects)
  local i = 6
  local n = tonumber(ARGV[5])
  local chunk = {}
  for j = 0, 2 * n - 1 do  -- HSET in chunks: unpack takes a bounded number of values
    chunk[#chunk + 1] = ARGV[i + j]
    if #chunk == 1000 then
      redis.call('HSET', state, unpack(chunk))
      chunk = {}
    end
  end
  if #chunk > 0 then redis.call('HSET', state, unpack(chunk)) end
  local set_from, set_to = i, i + 2 * n - 1
  i = i + 2 * n
  local d = tonumber(ARGV[i]); i = i + 1
  if d < 0 then
    local keep = {}
    for j = set_from, set_to, 2 do keep[ARGV[j]] = true end
    for _, f in ipairs(redis.call('HKEYS', state)) do
      if string.sub(f, 1, 5) == 'call:' and not keep[f] then redis.call('HDEL', state, f) end
    end
  else
    for _ = 1, d do
      redis.call('HDEL', state, ARGV[i])
      i = i + 1
    end
  end
  n = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n do
    redis.call('ZADD', checkpoints, tonumber(ARGV[i]), ARGV[i + 1])
    i = i + 2
  end
  local at = i
  n = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n do
    redis.call('HSET', effects, ARGV[i], ARGV[i + 1])
    i = i + 3
  end
  return at
end
