//! The key-value service: Redis-compatible commands, the state machine they apply to, and the
//! RESP front end that routes writes through the replicated log and reads through ReadIndex.

pub mod command;
mod command_stats;
pub mod curp;
mod decimal;
pub mod dump;
mod expiry;
mod fnv;
pub mod geo;
mod glob;
pub mod hyperloglog;
pub mod keyspace_events;
pub mod ldc;
pub mod listeners;
mod monitor;
pub mod server;
mod slowlog;
mod speculation;
pub mod state;
mod storage_metrics;
pub mod tracking;
pub mod unicache;

pub use server::{serve, FrontEndOptions, KvNode};
pub use state::KvState;
