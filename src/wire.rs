//! The Redis side: connections per deployment, the Lua scripts and the calls that send
//! them (keys, arguments, replies), the pub/sub subscriber, key slots, and the janitor
//! that deletes settled latches. It knows nothing of the client's state.

pub(crate) mod connection;
pub(crate) mod janitor;
pub(crate) mod pubsub;
pub(crate) mod raw;
pub(crate) mod scripts;
pub(crate) mod slot;
pub(crate) mod sync_raw;
