//! Runs the crate's Lua scripts in an embedded Lua 5.1 (the dialect of Redis) against a
//! [`Store`], with `KEYS`, `ARGV` and the `redis` library as Redis 7.0 gives them.
//!
//! An `mlua::Lua` is not `Send`, so each thread has its own, with each script compiled
//! once. The store is swapped into an `Rc<RefCell<..>>` that `redis.pcall` (Rust) closes
//! over for the length of one run; `redis.call` is Lua that raises the `{err=...}` table
//! `redis.pcall` answers, as Redis raises it.

use std::cell::RefCell;
use std::rc::Rc;

use mlua::{Function, Lua, Table, Value as LuaValue, Variadic};

use super::commands::{self, fmt_double};
use super::store::{Reply, Store};

/// The `redis` library beyond `pcall`, Redis's globals protection, and the guard that
/// runs a script: a raised `{err=...}` table (from `redis.call`) or a Lua error becomes
/// the error reply Redis would give.
const PRELUDE: &str = r#"
function redis.call(...)
    local r = redis.pcall(...)
    if type(r) == 'table' and r.err then
        error(r)
    end
    return r
end
function redis.error_reply(msg) return {err = msg} end
function redis.status_reply(msg) return {ok = msg} end
setmetatable(_G, {
    __newindex = function(_, k) error("Attempt to modify a readonly table: " .. tostring(k), 2) end,
    __index = function(_, k) error("Script attempted to access nonexistent global variable '" .. tostring(k) .. "'", 2) end,
})
return function(f)
    local ok, r = pcall(f)
    if ok then return r end
    if type(r) == 'table' and type(r.err) == 'string' then return r end
    return {err = 'ERR ' .. tostring(r)}
end
"#;

struct Engine {
    lua: Lua,
    store: Rc<RefCell<Store>>,
    /// Why the last run left the model (a command or option it does not cover).
    unmodelled: Rc<RefCell<Option<String>>>,
    guard: Function,
    /// Each source text with its compiled function. A linear scan: a handful of
    /// scripts, and comparing texts stops at their first difference.
    scripts: RefCell<Vec<(String, Function)>>,
}

thread_local! {
    static ENGINE: Engine = Engine::new().expect("the embedded Lua starts");
}

/// Runs `source` on `store` with these keys and arguments. `Ok` holds what Redis would
/// answer, error replies included; `Err` says the run left the model (the script does
/// not compile, or it called a command or option the store does not model).
pub fn run<K: AsRef<[u8]>, A: AsRef<[u8]>>(
    store: &mut Store,
    source: &str,
    keys: &[K],
    args: &[A],
) -> Result<Reply, String> {
    ENGINE.with(|e| e.run(store, source, keys, args))
}

impl Engine {
    fn new() -> mlua::Result<Engine> {
        let lua = Lua::new();
        let store = Rc::new(RefCell::new(Store::default()));
        let unmodelled = Rc::new(RefCell::new(None));
        let redis = lua.create_table()?;
        redis.set("pcall", pcall_fn(&lua, store.clone(), unmodelled.clone())?)?;
        lua.globals().set("redis", redis)?;
        let guard = lua.load(PRELUDE).set_name("=prelude").eval()?;
        Ok(Engine {
            lua,
            store,
            unmodelled,
            guard,
            scripts: RefCell::new(Vec::new()),
        })
    }

    fn compiled(&self, source: &str) -> Result<Function, String> {
        let mut scripts = self.scripts.borrow_mut();
        if let Some((_, f)) = scripts.iter().find(|(s, _)| s == source) {
            return Ok(f.clone());
        }
        let f = self.lua.load(source).set_name("=user_script");
        let f = f
            .into_function()
            .map_err(|e| format!("does not compile: {e}"))?;
        scripts.push((source.to_string(), f.clone()));
        Ok(f)
    }

    fn run<K: AsRef<[u8]>, A: AsRef<[u8]>>(
        &self,
        store: &mut Store,
        source: &str,
        keys: &[K],
        args: &[A],
    ) -> Result<Reply, String> {
        let f = self.compiled(source)?;
        let lua_err = |e: mlua::Error| format!("the embedded Lua failed: {e}");
        let globals = self.lua.globals();
        globals
            .raw_set("KEYS", self.list(keys).map_err(lua_err)?)
            .map_err(lua_err)?;
        globals
            .raw_set("ARGV", self.list(args).map_err(lua_err)?)
            .map_err(lua_err)?;
        std::mem::swap(&mut *self.store.borrow_mut(), store);
        let out = self.guard.call::<LuaValue>(f);
        std::mem::swap(&mut *self.store.borrow_mut(), store);
        if let Some(why) = self.unmodelled.borrow_mut().take() {
            return Err(why);
        }
        Ok(from_lua(&out.map_err(lua_err)?))
    }

    fn list<T: AsRef<[u8]>>(&self, items: &[T]) -> mlua::Result<Table> {
        let t = self.lua.create_table()?;
        for (i, item) in items.iter().enumerate() {
            t.raw_set(i + 1, self.lua.create_string(item.as_ref())?)?;
        }
        Ok(t)
    }
}

/// `redis.pcall`: runs a command on the store, answering errors as `{err=...}` tables.
fn pcall_fn(
    lua: &Lua,
    store: Rc<RefCell<Store>>,
    unmodelled: Rc<RefCell<Option<String>>>,
) -> mlua::Result<Function> {
    lua.create_function(move |lua, args: Variadic<LuaValue>| {
        let reply = match command_args(&args) {
            Err(msg) => Reply::err(msg),
            Ok(argv) => match commands::call(&mut store.borrow_mut(), &argv) {
                Ok(reply) => reply,
                Err(why) => {
                    let reply = Reply::err(format!("ERR not modelled: {why}"));
                    *unmodelled.borrow_mut() = Some(why);
                    reply
                }
            },
        };
        to_lua(lua, &reply)
    })
}

/// A command's arguments as Redis takes them from Lua: strings as they are, numbers
/// formatted as `%.17g`, anything else refused.
fn command_args(args: &[LuaValue]) -> Result<Vec<Vec<u8>>, String> {
    if args.is_empty() {
        return Err("ERR Please specify at least one argument for this redis lib call".into());
    }
    args.iter()
        .map(|a| match a {
            LuaValue::String(s) => Ok(s.as_bytes().to_vec()),
            LuaValue::Integer(i) => Ok(i.to_string().into_bytes()),
            LuaValue::Number(n) => Ok(fmt_double(*n).into_bytes()),
            _ => Err("ERR Lua redis lib command arguments must be strings or integers".into()),
        })
        .collect()
}

/// A reply as Lua sees it: integers as numbers, nil as false, status and error replies
/// as `{ok=...}` and `{err=...}` tables, arrays as tables.
fn to_lua(lua: &Lua, reply: &Reply) -> mlua::Result<LuaValue> {
    Ok(match reply {
        Reply::Nil => LuaValue::Boolean(false),
        Reply::Int(n) => LuaValue::Number(*n as f64),
        Reply::Bulk(b) => LuaValue::String(lua.create_string(b)?),
        Reply::Status(s) => LuaValue::Table(lua.create_table_from([("ok", s.as_str())])?),
        Reply::Error(s) => LuaValue::Table(lua.create_table_from([("err", s.as_str())])?),
        Reply::Array(items) => {
            let t = lua.create_table()?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            LuaValue::Table(t)
        }
    })
}

/// A script's return value as Redis gives it to the client: a number truncated to an
/// integer, true as 1, false as nil, `{err=..}` and `{ok=..}` tables as error and
/// status, other tables as arrays up to their first nil.
fn from_lua(v: &LuaValue) -> Reply {
    match v {
        LuaValue::Boolean(true) => Reply::Int(1),
        LuaValue::Integer(i) => Reply::Int(*i),
        LuaValue::Number(n) => Reply::Int(c_cast(*n)),
        LuaValue::String(s) => Reply::bulk(s.as_bytes()),
        LuaValue::Table(t) => from_table(t),
        _ => Reply::Nil,
    }
}

/// A Lua number as Redis 7.0 makes it an integer reply: C's `(long long)` cast, which
/// truncates, and on x86-64 gives i64::MIN for NaN and anything out of range (Rust's
/// `as` would saturate to i64::MAX instead).
fn c_cast(n: f64) -> i64 {
    if !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&n) {
        i64::MIN
    } else {
        n as i64
    }
}

fn from_table(t: &Table) -> Reply {
    if let Ok(LuaValue::String(e)) = t.raw_get("err") {
        return Reply::Error(e.to_string_lossy());
    }
    if let Ok(LuaValue::String(s)) = t.raw_get("ok") {
        return Reply::Status(s.to_string_lossy());
    }
    let mut items = Vec::new();
    for i in 1.. {
        match t.raw_get::<LuaValue>(i) {
            Ok(LuaValue::Nil) | Err(_) => break,
            Ok(v) => items.push(from_lua(&v)),
        }
    }
    Reply::Array(items)
}
