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
//!
//! A length mismatch speaks in the caller's units: the Rust crate counts bytes, but a caller of
//! `allreduce_sum_f64` passed float64 elements, so while a collective on an array runs
//! ([`speak_in`]) the message counts that array's elements and names its dtype ("rank 2
//! passed 1000 float64 elements where this rank (rank 0) passed 1024"). A ring's error sticks,
//! and a later call of another dtype raises it again: it keeps the units of the call that
//! failed (the caller of [`speak_in`] decides which). Calls on bytes keep the crate's message.

use std::cell::Cell;

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

/// The elements of a caller's array, as its errors count them: its dtype's name as numpy gives
/// it and the bytes of one element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unit {
    /// The dtype's name, such as `"float64"`.
    pub(crate) dtype: &'static str,
    /// Bytes of one element.
    pub(crate) width: usize,
}

/// The units of the collective running on this thread, and this rank's number.
#[derive(Debug, Clone, Copy)]
struct Speech {
    unit: Unit,
    rank: usize,
}

thread_local! {
    /// What [`speak_in`] set on this thread: errors converted while it holds count elements.
    static SPEECH: Cell<Option<Speech>> = const { Cell::new(None) };
}

/// While the returned guard lives, the errors [`collective`] converts on this thread count
/// `unit`s of rank `rank`'s array (no unit: bytes, the crate's own message). A collective and
/// its conversion of errors run on one thread (the GIL is released and taken back on it).
pub(crate) fn speak_in(unit: Option<Unit>, rank: usize) -> Speaking {
    let speech = unit.map(|unit| Speech { unit, rank });
    Speaking { before: SPEECH.with(|s| s.replace(speech)) }
}

/// Restores, when dropped, the units in force before [`speak_in`].
#[derive(Debug)]
pub(crate) struct Speaking {
    before: Option<Speech>,
}

impl Drop for Speaking {
    fn drop(&mut self) {
        SPEECH.with(|s| s.set(self.before));
    }
}

/// `error`'s message as `rank` (this rank, or the origin of an abort) tells it, lengths in
/// `speech`'s units where it has one and the lengths are whole elements.
fn message(error: &RustCollectiveError, speech: Option<Speech>, this: bool) -> String {
    let Some(Speech { unit, rank }) = speech else {
        return error.to_string();
    };
    match error {
        RustCollectiveError::LengthMismatch { peer, expected, got } => {
            let width = unit.width as u64;
            if width == 0 || expected % width != 0 || got % width != 0 {
                return error.to_string();
            }
            let who =
                if this { format!("this rank (rank {rank})") } else { format!("rank {rank}") };
            format!(
                "rank {peer} passed {} {} elements where {who} passed {}",
                got / width,
                unit.dtype,
                expected / width
            )
        }
        RustCollectiveError::Aborted { origin, cause } => {
            let speech = Speech { unit, rank: *origin };
            format!("rank {origin} failed: {}", message(cause, Some(speech), false))
        }
        other => other.to_string(),
    }
}

fn collective_exception(
    py: Python<'_>,
    error: &RustCollectiveError,
    speech: Option<Speech>,
    this: bool,
) -> PyResult<PyErr> {
    let exception = CollectiveError::new_err(message(error, speech, this));
    let value = exception.value(py);
    value.setattr("kind", error.kind())?;
    value.setattr("peer", error.peer())?;
    if let RustCollectiveError::Aborted { origin, cause } = error {
        value.setattr("origin", *origin)?;
        let theirs = speech.map(|s| Speech { rank: *origin, ..s });
        let origin_error = collective_exception(py, cause, theirs, false)?;
        value.setattr("origin_error", origin_error.into_value(py))?;
    } else {
        value.setattr("origin", py.None())?;
        value.setattr("origin_error", py.None())?;
    }
    Ok(exception)
}

/// The Python [`CollectiveError`] for `error`, in the units [`speak_in`] set on this thread.
pub(crate) fn collective(py: Python<'_>, error: &RustCollectiveError) -> PyErr {
    let speech = SPEECH.with(Cell::get);
    collective_exception(py, error, speech, true).unwrap_or_else(|e| e)
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
