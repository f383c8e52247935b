-- The limiter people use instead of a quota service: a day and a month counter in Redis.
-- KEYS[1] day counter, KEYS[2] month counter; ARGV: day limit, month limit, day TTL, month TTL.
local day = tonumber(redis.call('GET', KEYS[1]) or '0')
local month = tonumber(redis.call('GET', KEYS[2]) or '0')
if day >= tonumber(ARGV[1]) or month >= tonumber(ARGV[2]) then
  return 0
end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 1
