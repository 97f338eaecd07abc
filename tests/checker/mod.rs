//! The model checker's foundation: an in-memory store of Redis state and a runner of the
//! crate's real Lua scripts against it (issue 24). `tests/lua_store_diff.rs` ties the
//! store to a real redis-server.

// Each test binary that includes this uses only part of it.
#![allow(dead_code)]

pub mod collections;
pub mod commands;
pub mod script;
pub mod store;
pub mod zset;
