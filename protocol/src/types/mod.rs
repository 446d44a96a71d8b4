//! Typed params and results, one module per method family.

pub mod exec;
pub mod fs;
pub mod http;
pub mod network;
pub mod process;
pub mod sandbox;
pub mod session;

use serde::{Deserialize, Serialize};

/// The `{}` result (and params) of methods that carry nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

pub use crate::methods::validate_params;

pub(crate) fn yes() -> bool {
    true
}
