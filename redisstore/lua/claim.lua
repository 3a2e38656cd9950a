-- Claim: the two-step claim, atomic because a script runs alone on the
-- server. It creates the record or reads it, compares fingerprints, and
-- leases the key in the server's clock (TIME), in one round trip.
--
-- KEYS[1]  the record (a hash), KEYS[2] the store's fence counter
-- ARGV[1]  fingerprint (32 bytes)   ARGV[2] lease, microseconds
-- ARGV[3]  retention, microseconds  ARGV[4] claim id (random, per call)
--
-- Returns {outcome, fence, retry_after_us, expires_in_us, status, headers, body}
-- (trailing members only where the outcome has them).
--
-- Times are microseconds since the epoch in Lua numbers (doubles): exact
-- up to 2^53, about 285 years from 1970. They are written with %.0f, as
-- tostring would write 1.8e+15.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local r = redis.call('HMGET', KEYS[1], 'fp', 'st', 'fence', 'lease', 'exp', 'cid', 'out')
local outcome = 'claimed'
-- A record whose retention has ended is a new key, whether or not Redis
-- has deleted it yet (its expiry is set to the millisecond after).
if r[1] and tonumber(r[5]) > now then
  if r[1] ~= ARGV[1] then
    return {'mismatch'}
  end
  if r[2] == 'done' then
    local resp = redis.call('HMGET', KEYS[1], 'status', 'hdr', 'body')
    return {'completed', 0, 0, tonumber(r[5]) - now, resp[1], resp[2], resp[3]}
  end
  if r[2] == 'claimed' then
    -- The same call again: the client re-sent it because the reply was
    -- lost (go-redis retries a command whose connection broke). The
    -- first run took the key; the caller gets that claim back, not
    -- in-progress for its own claim.
    if r[6] == ARGV[4] then
      return {r[7], tonumber(r[3])}
    end
    local lease = tonumber(r[4])
    if lease > now then
      return {'in_progress', 0, lease - now}
    end
    outcome = 'took_over'
  elseif r[2] ~= 'released' then
    return redis.error_reply('redisstore: corrupt record: unknown state')
  end
  -- 'released' with the same fingerprint: claimed again at once.
end
-- The fence: the store's counter plus one, but never below the server's
-- clock in microseconds, nor at or below the fence this record had. The
-- counter has no expiry, so a key that expired and came back still gets
-- a fence above its old one; the clock floor keeps fences from repeating
-- even when the counter itself is lost (a restart without persistence,
-- a failover to a replica that had not seen the last claims), as long as
-- the server's clock does not go back by more than the outage lasted.
local fence = redis.call('INCR', KEYS[2])
local counted = fence
if fence < now then
  fence = now
end
local prev = tonumber(r[3])
if prev and fence <= prev then
  fence = prev + 1
end
if fence ~= counted then
  redis.call('SET', KEYS[2], string.format('%.0f', fence))
end
local exp = now + tonumber(ARGV[3])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1],
  'fp', ARGV[1], 'st', 'claimed', 'fence', string.format('%.0f', fence),
  'lease', string.format('%.0f', now + tonumber(ARGV[2])),
  'exp', string.format('%.0f', exp), 'cid', ARGV[4], 'out', outcome)
-- Retention is the key's expiry, rounded up to the next millisecond.
redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', math.ceil(exp / 1000)))
return {outcome, fence}
