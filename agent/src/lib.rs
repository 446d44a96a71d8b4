//! # executor-agent
//!
//! The `executor` agent: serves one connection of the executor wire protocol
//! (see the `executor-protocol` crate) on a byte stream, normally its own
//! stdin/stdout under `ssh devbox executor`.
//!
//! Data flows one way: bytes → [`conn`] (framing, concurrency, flow control)
//! → [`dispatch`] (the only place a method name maps to a handler) → a
//! handler in a module per method family → typed result → [`conn`] → bytes.
//! Handlers never see bytes or frames.
#![forbid(unsafe_code)]

pub mod audit;
pub mod config;
pub mod conn;
pub mod dispatch;
pub mod exec;
pub mod forced;
pub mod fs;
pub mod host;
pub mod http;
pub mod process;
pub mod sandbox_gate;
pub mod session;
pub mod tools;

pub use conn::serve;
