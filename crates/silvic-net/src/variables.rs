//! The process environment, read one way: every variable silvic-net reads from it
//! (`SILVIC_ALLREDUCE` in `connect`, `from_env`'s in `launch/`) goes through [`process_var`].
//!
//! Invariant: a value that is not UTF-8 is an error naming the variable, never taken as unset
//! (which would silently pick another variable, as `MASTER_ADDR` in place of a broken
//! `SILVIC_RENDEZVOUS`). A leaf: it uses nothing of this crate but its error type.

use crate::error::ConnectError;

/// The process environment's `name`: `None` where it is unset, an error where its value is not
/// UTF-8.
pub(crate) fn process_var(name: &str) -> Result<Option<String>, ConnectError> {
    match std::env::var_os(name) {
        None => Ok(None),
        Some(value) => value.into_string().map(Some).map_err(|v| ConnectError::Environment {
            variable: name.to_string(),
            message: format!("not UTF-8: {v:?}"),
        }),
    }
}
