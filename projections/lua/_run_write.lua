-- (included) Write one run update to the run's own keys, shared by apply.lua and
-- cluster_apply.lua. ARGV from 5: n_fields, field/value pairs..., n_checkpoints, score/member
-- pairs..., n_effects, delivery_key/json/sort_key triples... Returns the ARGV index of n_effects
-- (the caller's index writes read the effect triples from there).
local function write_run(state, checkpoints, effects)
  local i = 6
  local n = tonumber(ARGV[5])
  local fields = {}
  for j = 1, 2 * n do fields[j] = ARGV[i + j - 1] end
  i = i + 2 * n
  redis.call('HSET', state, unpack(fields))
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
