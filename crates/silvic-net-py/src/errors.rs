//! The Python exceptions (`SilvicError`, and under it `CollectiveError` and `ConnectError`), and
//! the one place where Rust errors become them.
//!
//! Each exception carries the Rust error's `Display` text as its message and its fields as
//! attributes (`kind`, `peer`, ...), so a Python caller can branch on the kind without parsing
//! text. Kinds and reasons are the Rust crate's own names (`kind()`, `RejectReason::name`):
//! this module keeps no table of them.
//!
//! The attributes live in the instance `__dict__` (never on the class), which pickles: a Ray
//! actor's error reaches the driver with them intact, and the `RayTaskError(...)` that
//! `ray.get` raises finds them through its `cause` (it looks up on the cause what it lacks
//! itself). For that reason the Rust `Aborted { cause }` is `origin_error` here: Ray's wrapper
//! has a `cause` of its own.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use silvic_net::{CollectiveError as RustCollectiveError, ConnectError as RustConnectError};

create_exception!(
    silvic_net,
    SilvicError,
    PyException,
    "The base of every error silvic-net raises (CollectiveError and ConnectError), for a caller \
     that handles them alike. Bad arguments raise TypeError or ValueError instead."
);

create_exception!(
    silvic_net,
    CollectiveError,
    SilvicError,
    "A collective failed: a peer closed, timed out, fell out of step, or another rank failed \
     first.\n\nAttributes: `kind` (str), `peer` (int or None: the rank involved), `origin` \
     (int or None: where an `aborted` failure began) and `origin_error` (CollectiveError or \
     None: what the origin saw). The ring is closed after it: every later call raises the same \
     error."
);

create_exception!(
    silvic_net,
    ConnectError,
    SilvicError,
    "Binding or joining a ring failed.\n\nAttributes: `kind` (str), `peer` (int or None: the \
     rank involved), `address` (str or None: that rank's network address, when known), `path` \
     (str or None: the rendezvous file or folder at fault) and `reason` (str or None: why a \
     handshake was rejected, such as \"token_mismatch\")."
);

fn collective_exception(py: Python<'_>, error: &RustCollectiveError) -> PyResult<PyErr> {
    let exception = CollectiveError::new_err(error.to_string());
    let value = exception.value(py);
    value.setattr("kind", error.kind())?;
    value.setattr("peer", error.peer())?;
    if let RustCollectiveError::Aborted { origin, cause } = error {
        value.setattr("origin", *origin)?;
        value.setattr("origin_error", collective_exception(py, cause)?.into_value(py))?;
    } else {
        value.setattr("origin", py.None())?;
        value.setattr("origin_error", py.None())?;
    }
    Ok(exception)
}

/// The Python [`CollectiveError`] for `error`.
pub(crate) fn collective(py: Python<'_>, error: &RustCollectiveError) -> PyErr {
    collective_exception(py, error).unwrap_or_else(|e| e)
}

fn connect_exception(py: Python<'_>, error: &RustConnectError) -> PyResult<PyErr> {
    let (path, reason) = match error {
        RustConnectError::Folder { path, .. } => (Some(path.as_str()), None),
        RustConnectError::Rejected { reason, .. } => (None, Some(reason.name())),
        _ => (None, None),
    };
    let exception = ConnectError::new_err(error.to_string());
    let value = exception.value(py);
    value.setattr("kind", error.kind())?;
    value.setattr("peer", error.peer())?;
    value.setattr("address", error.address())?;
    value.setattr("path", path)?;
    value.setattr("reason", reason)?;
    Ok(exception)
}

/// The Python [`ConnectError`] for `error`.
pub(crate) fn connect(py: Python<'_>, error: &RustConnectError) -> PyErr {
    connect_exception(py, error).unwrap_or_else(|e| e)
}

/// A [`ConnectError`] of kind `invalid_argument` for a misuse only Python can make (such as a
/// listener given to `connect` twice), in the same shape as the Rust crate's own.
pub(crate) fn invalid_argument(py: Python<'_>, message: String) -> PyErr {
    connect(py, &RustConnectError::InvalidArgument(message))
}
