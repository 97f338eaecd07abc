-- Included by every script that takes or deletes a lock: whether a hash is a lock.
-- A lock has at least one holder and nothing else but a read-write lock's 'mode' ('read'
-- or 'write'). A holder is a field '<uuid>:<owner>' whose value is a positive count; the
-- owner is a thread id ('-' allowed), 'thread-<n>' or 'scope-<n>', and a writer's field
-- ends in ':write' (src/wire/raw/shape.rs states the same rule). Anything else at the name is
-- application data, never to be written or deleted.
local UUID = '^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x:'
local function is_holder(field, value)
    if not string.find(field, UUID) or not string.find(value, '^%d+$')
        or tonumber(value) < 1 then
        return false
    end
    local owner = string.sub(field, 38)
    if string.sub(owner, -6) == ':write' then
        owner = string.sub(owner, 1, -7)
    end
    return string.find(owner, '^%-?%d+$') ~= nil or string.find(owner, '^thread%-%d+$') ~= nil
        or string.find(owner, '^scope%-%d+$') ~= nil
end
-- true or false; nil when an ACL refuses HGETALL and the hash cannot be read.
local function is_lock(key)
    local all = redis.pcall('hgetall', key)
    if all.err then
        if string.sub(all.err, 1, 9) == 'WRONGTYPE' then
            error(all)
        end
        return nil
    end
    local holders = 0
    for i = 1, #all, 2 do
        local field, value = all[i], all[i + 1]
        if field == 'mode' then
            if value ~= 'read' and value ~= 'write' then
                return false
            end
        elseif is_holder(field, value) then
            holders = holders + 1
        else
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
        return redis.error_reply('NOPERM a force unlock reads the hash (HGETALL) to tell a lock from data')
    elseif shape ~= true then
        return not_a_lock(key)
    end
    return nil
end
