//! The session's state tables: [`jobs`] (processes and their buffered
//! output), [`handles`] (open file handles), [`streams`] (streamed HTTP
//! responses), [`once`] (requests that happen once per client-chosen key).
//!
//! The layer between [`crate::outbound`] and [`crate::session`]: the
//! tables hold data and the rules that keep it consistent (bounds, ids,
//! reaping), use `outbound` to push a job's output, and import nothing
//! above them. The handlers that fill them are one module per method
//! family (`process`, `fs`, `http`).

pub mod handles;
pub mod jobs;
pub mod once;
pub mod output;
pub mod streams;
