//! The client's state per lock name, shared by its tasks under one mutex: the holds by
//! field and the requests in flight (`table`), the sleeping waiters (`queue`) and the
//! hand-over runs over them (`handover`). Each change is one critical section that asks
//! `policy` what to do; no Redis here.

pub(crate) mod handover;
pub(crate) mod queue;
pub(crate) mod table;
