//! Hash and list commands. A hash or list left empty is deleted with its TTL, as Redis
//! does after every removal.

use super::commands::{int_arg, parse_i64, Out};
use super::store::{Reply, Store};

/// Unwraps a typed read, or answers its WRONGTYPE error.
macro_rules! read_or_reply {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return Ok(e),
        }
    };
}

pub fn hget(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let h = read_or_reply!(s.hash(&a[0]));
    Ok(h.and_then(|h| h.get(&a[1])).map_or(Reply::Nil, Reply::bulk))
}

pub fn hexists(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let h = read_or_reply!(s.hash(&a[0]));
    Ok(Reply::Int(h.is_some_and(|h| h.contains_key(&a[1])) as i64))
}

/// `HSET key field value [field value ...]`: how many fields are new.
pub fn hset(s: &mut Store, a: &[Vec<u8>]) -> Out {
    if a.len().is_multiple_of(2) {
        return Ok(Reply::err(
            "ERR wrong number of arguments for 'hset' command",
        ));
    }
    let h = read_or_reply!(s.hash_mut(&a[0]));
    let added = a[1..]
        .chunks(2)
        .filter(|p| h.insert(p[0].clone(), p[1].clone()).is_none())
        .count();
    Ok(Reply::Int(added as i64))
}

/// `HINCRBY key field n`: a field that holds no integer is an error, an absent one 0.
pub fn hincrby(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let by = read_or_reply!(int_arg(&a[2]));
    let h = read_or_reply!(s.hash_mut(&a[0]));
    let old = match h.get(&a[1]) {
        None => 0,
        Some(v) => match parse_i64(v) {
            Some(n) => n,
            None => return Ok(Reply::err("ERR hash value is not an integer")),
        },
    };
    let Some(new) = old.checked_add(by) else {
        return Ok(Reply::err("ERR increment or decrement would overflow"));
    };
    h.insert(a[1].clone(), new.to_string().into_bytes());
    Ok(Reply::Int(new))
}

pub fn hdel(s: &mut Store, a: &[Vec<u8>]) -> Out {
    if read_or_reply!(s.hash(&a[0])).is_none() {
        return Ok(Reply::Int(0));
    }
    let h = read_or_reply!(s.hash_mut(&a[0]));
    let removed = a[1..].iter().filter(|f| h.remove(*f).is_some()).count();
    s.drop_if_empty(&a[0]);
    Ok(Reply::Int(removed as i64))
}

pub fn hlen(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let h = read_or_reply!(s.hash(&a[0]));
    Ok(Reply::Int(h.map_or(0, |h| h.len()) as i64))
}

/// The fields, values or both of a hash, in the store's order (Redis's own order is
/// not specified; a comparison must sort).
fn hash_items(s: &Store, key: &[u8], keys: bool, values: bool) -> Reply {
    let h = match s.hash(key) {
        Ok(h) => h,
        Err(e) => return e,
    };
    let mut out = Vec::new();
    for (f, v) in h.into_iter().flatten() {
        if keys {
            out.push(Reply::bulk(f));
        }
        if values {
            out.push(Reply::bulk(v));
        }
    }
    Reply::Array(out)
}

pub fn hkeys(s: &mut Store, a: &[Vec<u8>]) -> Out {
    Ok(hash_items(s, &a[0], true, false))
}

pub fn hvals(s: &mut Store, a: &[Vec<u8>]) -> Out {
    Ok(hash_items(s, &a[0], false, true))
}

pub fn hgetall(s: &mut Store, a: &[Vec<u8>]) -> Out {
    Ok(hash_items(s, &a[0], true, true))
}

/// A list index as Redis reads one: negative counts from the end.
fn index(i: i64, len: usize) -> i64 {
    if i < 0 {
        i + len as i64
    } else {
        i
    }
}

/// `LINDEX key i`: the key is looked up before the index is read, as in Redis.
pub fn lindex(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let Some(l) = read_or_reply!(s.list(&a[0])) else {
        return Ok(Reply::Nil);
    };
    let i = index(read_or_reply!(int_arg(&a[1])), l.len());
    let item = usize::try_from(i).ok().and_then(|i| l.get(i));
    Ok(item.map_or(Reply::Nil, Reply::bulk))
}

pub fn lpop(s: &mut Store, a: &[Vec<u8>]) -> Out {
    if a.len() > 1 {
        return Err("LPOP with a count is not modelled".into());
    }
    if read_or_reply!(s.list(&a[0])).is_none() {
        return Ok(Reply::Nil);
    }
    let head = read_or_reply!(s.list_mut(&a[0])).pop_front();
    s.drop_if_empty(&a[0]);
    Ok(head.map_or(Reply::Nil, Reply::Bulk))
}

pub fn rpush(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let l = read_or_reply!(s.list_mut(&a[0]));
    l.extend(a[1..].iter().cloned());
    Ok(Reply::Int(l.len() as i64))
}

/// `LREM key count value`: count > 0 from the head, < 0 from the tail, 0 all.
pub fn lrem(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let count = read_or_reply!(int_arg(&a[1]));
    if read_or_reply!(s.list(&a[0])).is_none() {
        return Ok(Reply::Int(0));
    }
    let l = read_or_reply!(s.list_mut(&a[0]));
    let limit = if count == 0 {
        usize::MAX
    } else {
        count.unsigned_abs() as usize
    };
    let mut hits: Vec<usize> = (0..l.len()).filter(|&i| l[i] == a[2]).collect();
    if count < 0 {
        hits.reverse();
    }
    hits.truncate(limit);
    hits.sort_unstable();
    for i in hits.iter().rev() {
        l.remove(*i);
    }
    s.drop_if_empty(&a[0]);
    Ok(Reply::Int(hits.len() as i64))
}

/// `LRANGE key start stop`, both inclusive, clamped as Redis clamps them.
pub fn lrange(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let start = read_or_reply!(int_arg(&a[1]));
    let stop = read_or_reply!(int_arg(&a[2]));
    let Some(l) = read_or_reply!(s.list(&a[0])) else {
        return Ok(Reply::Array(Vec::new()));
    };
    let len = l.len() as i64;
    let start = index(start, l.len()).max(0);
    let stop = index(stop, l.len()).min(len - 1);
    if start > stop {
        return Ok(Reply::Array(Vec::new()));
    }
    let items = l.range(start as usize..=stop as usize).map(Reply::bulk);
    Ok(Reply::Array(items.collect()))
}

/// `LPOS key element`: the first index, or nil.
pub fn lpos(s: &mut Store, a: &[Vec<u8>]) -> Out {
    if a.len() > 2 {
        return Err("LPOS options are not modelled".into());
    }
    let l = read_or_reply!(s.list(&a[0]));
    let at = l.and_then(|l| l.iter().position(|x| *x == a[1]));
    Ok(at.map_or(Reply::Nil, |i| Reply::Int(i as i64)))
}

pub fn llen(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let l = read_or_reply!(s.list(&a[0]));
    Ok(Reply::Int(l.map_or(0, |l| l.len()) as i64))
}
