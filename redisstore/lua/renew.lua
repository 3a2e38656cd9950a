-- Renew: extends a live lease of the fence's owner to lease from the
-- server's now, and the record's retention (its key's expiry) to at least
-- the same end. A lease that has run out is not renewed, even if nobody
-- took the key over: its owner's handler has been stopped by then.
--
-- KEYS[1] the record; ARGV[1] fence; ARGV[2] lease, microseconds.
-- Returns 1 when renewed, 0 when fenced out.
local r = redis.call('HMGET', KEYS[1], 'st', 'fence', 'lease', 'exp')
if r[1] ~= 'claimed' or r[2] ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if tonumber(r[3]) <= now or tonumber(r[4]) <= now then
  return 0
end
local lease = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'lease', string.format('%.0f', lease))
if tonumber(r[4]) < lease then
  redis.call('HSET', KEYS[1], 'exp', string.format('%.0f', lease))
  redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', math.ceil(lease / 1000)))
end
return 1
