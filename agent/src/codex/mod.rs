//! Codex's exec-server dialect.
pub mod sandbox;
