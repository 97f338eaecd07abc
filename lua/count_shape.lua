-- Included by the semaphore and latch scripts that write a count: a key that holds
-- anything but an integer string is not a semaphore or latch, and every script answers
-- it with a WRONGTYPE error before it writes, whatever path it would take (Redisson's
-- scripts would meet Redis's "not an integer" error at INCRBY or DECR on some paths and
-- answer false on others). A key of another type than string fails at GET with Redis's
-- own WRONGTYPE.
local function count_at(key)
    local value = redis.call('get', key)
    if value ~= false and not string.find(value, '^%-?%d+$') then
        error({err = 'WRONGTYPE the key does not hold a count'})
    end
    return value
end
