-- Delete a lock whoever holds it, and wake its waiters.
-- KEYS[1]  lock hash
-- KEYS[2]  unlock channel
-- ARGV[1]  unlock message ("0")
-- ARGV[2]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- Returns 1 when a lock was deleted, 0 when there was none.
if redis.call('exists', KEYS[1]) == 1 then
    -- PUBLISH first: if ACL refuses it, nothing has been deleted.
    redis.call(ARGV[2], KEYS[2], ARGV[1])
    redis.call('del', KEYS[1])
    return 1
end
return 0
