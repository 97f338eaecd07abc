//! Checker v0 (issue 24): an exhaustive explorer over the plain lock's real scripts,
//! driven by Redisson actors and a model of this crate's client (`client.rs`).

pub mod cache;
pub mod client;
pub mod client_replies;
pub mod configs;
pub mod explore;
pub mod late;
pub mod por;
pub mod props;
pub mod redisson;
pub mod symmetry;
pub mod world;
