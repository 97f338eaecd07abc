-- Prepended to every script that takes or deletes a lock: whether a hash is a lock.
-- A lock's fields are holder fields of Redisson's shape, '<client uuid>:<owner id>'
-- (a writer's ends in ':write'), plus a read-write lock's 'mode'; at least one holder.
-- Anything else at the name is application data, never to be written or deleted.
local HOLDER_FIELD = '^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x:.'
-- true or false; nil when an ACL refuses HKEYS and the fields cannot be read.
local function is_lock(key)
    local fields = redis.pcall('hkeys', key)
    if fields.err then
        if string.sub(fields.err, 1, 9) == 'WRONGTYPE' then
            error(fields)
        end
        return nil
    end
    local holders = 0
    for _, field in ipairs(fields) do
        if string.find(field, HOLDER_FIELD) then
            holders = holders + 1
        elseif field ~= 'mode' then
            return false
        end
    end
    return holders > 0
end
-- The reply for a name that holds a hash that is not a lock.
local function not_a_lock(key)
    return redis.error_reply('NOTALOCK ' .. key)
end
-- Whether a deletion may go ahead: nil when it may, else the reply that refuses it.
local function refuse_unless_lock(key)
    local shape = is_lock(key)
    if shape == nil then
        return redis.error_reply('NOPERM a force unlock reads the hash fields (HKEYS) to tell a lock from data')
    elseif shape ~= true then
        return not_a_lock(key)
    end
    return nil
end
