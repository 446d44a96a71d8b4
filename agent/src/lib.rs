//! # executor-agent
//!
//! The `executor` agent: serves one connection of the executor wire protocol
//! (see the `executor-protocol` crate) on a byte stream, normally its own
//! stdin/stdout under `ssh devbox executor`.
//!
//! A request: bytes → [`conn`] (framing, admission, concurrency, flow
//! control) → [`dispatch`] (the only place a method name maps to a
//! handler) → a handler in a module per method family (`process`, `exec`,
//! `fs`, `http`, `tools`) working on the [`session`]'s tables → a result
//! framed by [`dispatch`] → [`outbound`] (frames out, the bottom layer) →
//! bytes. Process output and HTTP bodies are pushed as notifications
//! through the session's [`outbound::Outbound`]. A sandboxed job with
//! egress by name reaches the network through its [`egress`] proxy.
#![forbid(unsafe_code)]

pub mod audit;
pub mod config;
pub mod conn;
pub mod destinations;
pub mod dispatch;
pub mod egress;
pub mod exec;
pub mod forced;
pub mod fs;
pub mod host;
pub mod http;
pub mod outbound;
pub mod process;
pub mod sandbox_gate;
pub mod session;
pub mod tools;

pub use conn::serve;
