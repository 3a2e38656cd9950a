-- Complete: stores the response if the fence still owns the claim (the
-- compare-and-set on the token), and keeps the record for retention from
-- the server's now.
--
-- KEYS[1] the record; ARGV[1] fence; ARGV[2] status; ARGV[3] headers
-- (JSON); ARGV[4] body; ARGV[5] retention, microseconds.
-- Returns 1 when stored (or already stored, identically, by this fence),
-- 0 when fenced out.
local r = redis.call('HMGET', KEYS[1], 'st', 'fence')
if r[2] ~= ARGV[1] then
  return 0
end
if r[1] == 'done' then
  -- The same completion re-sent after a lost reply succeeds; any other
  -- second completion is refused and never replaces the stored answer.
  local s = redis.call('HMGET', KEYS[1], 'status', 'hdr', 'body')
  if s[1] == ARGV[2] and s[2] == ARGV[3] and s[3] == ARGV[4] then
    return 1
  end
  return 0
end
if r[1] ~= 'claimed' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local exp = now + tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'st', 'done', 'status', ARGV[2], 'hdr', ARGV[3], 'body', ARGV[4],
  'exp', string.format('%.0f', exp))
redis.call('HDEL', KEYS[1], 'lease', 'cid', 'out')
redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', math.ceil(exp / 1000)))
return 1
