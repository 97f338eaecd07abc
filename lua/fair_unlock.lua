-- Release holds of a fair lock, at most once per request; a full release notifies the
-- waiter first in line on its own channel (Redisson's RFairLock).
-- KEYS[1]  lock hash
-- KEYS[2]  queue: redisson_lock_queue:{<name>}
-- KEYS[3]  deadlines: redisson_lock_timeout:{<name>}
-- KEYS[4]  unlock latch: redisson_unlock_latch:{<name>}:<request id>
-- ARGV[1]  unlock message ("0")
-- ARGV[2]  lease to set when holds remain, in ms; 0 leaves the TTL as it is
-- ARGV[3]  holder field
-- ARGV[4]  how long the latch is kept, in ms
-- ARGV[5]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- ARGV[6]  how many holds to release
-- ARGV[7]  '1' when this request was sent before and its reply was lost
-- ARGV[8]  the lock's channel, redisson_lock__channel:{<name>}; a waiter's is
--          "<channel>:<its holder field>"
-- Returns nil when the caller holds nothing, 0 when holds remain, 1 when the lock was
-- released. A partial release latches '0'; every send replays a latch it finds, and a
-- retry latches every outcome ('x' for nothing held), as in unlock.lua.
local retry = ARGV[7] == '1'
-- Every send, not only a retry: a late copy of an answered unlock must not release a
-- newer hold of the field (unlock.lua, issue 24's finding 7).
local done = redis.call('get', KEYS[4])
if done then
    if retry then
        -- A write, for replica sync's WAIT (see unlock.lua).
        redis.call('pexpire', KEYS[4], ARGV[4])
    end
    return tonumber(done)
end
-- A retry leaves its outcome for the copies still on their way; out of memory it stands
-- without.
local function settle(outcome)
    if retry then
        redis.pcall('set', KEYS[4], outcome, 'px', ARGV[4])
    end
end
local count = tonumber(redis.call('hget', KEYS[1], ARGV[3]))
if count == nil then
    settle('x')
    return nil
end
local n = tonumber(ARGV[6])
if count > n then
    redis.call('hincrby', KEYS[1], ARGV[3], -n)
    if tonumber(ARGV[2]) > 0 then
        redis.call('pexpire', KEYS[1], ARGV[2])
    end
    redis.call('set', KEYS[4], 0, 'px', ARGV[4])
    return 0
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
while true do
    local head = redis.call('lindex', KEYS[2], 0)
    if not head then
        break
    end
    local deadline = tonumber(redis.call('zscore', KEYS[3], head))
    if deadline and deadline > now then
        break
    end
    redis.call('lpop', KEYS[2])
    redis.call('zrem', KEYS[3], head)
end
-- Notified before any write, as in unlock.lua: a refused publish leaves the lock as it was.
local head = redis.call('lindex', KEYS[2], 0)
if head then
    local sent = redis.pcall(ARGV[5], ARGV[8] .. ':' .. head, ARGV[1])
    if type(sent) == 'table' and sent.err then
        return redis.error_reply('NOPERM publish refused: ' .. sent.err)
    end
end
redis.call('del', KEYS[1])
settle('1')
return 1
