-- Release: gives up the fence's claim, so that the next request with the
-- same fingerprint claims the key at once. The record keeps its
-- retention: a different request still gets mismatch until it ends.
--
-- KEYS[1] the record; ARGV[1] fence.
-- Returns 1 when released (or already released by this fence), 0 when
-- fenced out.
local r = redis.call('HMGET', KEYS[1], 'st', 'fence')
if r[2] ~= ARGV[1] then
  return 0
end
if r[1] == 'released' then
  return 1
end
if r[1] ~= 'claimed' then
  return 0
end
redis.call('HSET', KEYS[1], 'st', 'released')
redis.call('HDEL', KEYS[1], 'lease', 'cid', 'out')
return 1
