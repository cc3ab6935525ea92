-- (included) The global effects index's winner rule, shared by apply.lua and cluster_index.lua:
-- per delivery key the entry with the smallest sort key is kept (done beats open, then the
-- earliest opened, then run id), compared bytewise, never with the server's locale. An indexed
-- value without a sort key (written before it existed) is replaced.
-- a <= b, byte by byte (Lua's own string comparison follows the server's LC_COLLATE)
local function not_after(a, b)
  local n = math.min(#a, #b)
  for j = 1, n do
    local x, y = string.byte(a, j), string.byte(b, j)
    if x ~= y then return x < y end
  end
  return #a <= #b
end
-- Write effect json under delivery key dk in the index hash unless the entry held there has a
-- smaller sort key. Returns 1 written, 0 kept.
local function index_effect(hash, dk, json, sort_key)
  local raw = redis.call('HGET', hash, dk)
  local held = nil
  if raw then
    local ok, d = pcall(cjson.decode, raw)
    if ok and type(d) == 'table' and type(d['sort_key']) == 'string' then held = d['sort_key'] end
  end
  if held == nil or not_after(sort_key, held) then
    redis.call('HSET', hash, dk, json)
    return 1
  end
  return 0
end
