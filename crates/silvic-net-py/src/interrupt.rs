//! Calls that Ctrl-C interrupts: every call that waits on the network (`connect`, `from_env`,
//! each collective) runs without the GIL under a `silvic_net::Cancel` whose check takes the
//! GIL for a moment, about every 100 ms while the call waits, and asks Python whether a signal
//! is pending. When one is, Python's handler runs there (for SIGINT, it raises
//! `KeyboardInterrupt`), the cancel trips, the call ends as any failure does (a ring's error
//! sticks, and the other ranks hear an abort naming this rank), and the handler's exception is
//! what the call raises.
//!
//! LightGBM's network hooks run the same way ([`interruptible`]): their collective ends, LightGBM
//! raises, and `silvic_net.lightgbm.network` raises the handler's exception in its place.
//!
//! Python runs signal handlers on the main thread only: a call on another thread is not
//! interrupted (its check finds nothing), as with any Python code.

use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;
use silvic_net::Cancel;

/// Runs `call` without the GIL, as `py.detach` does, and interruptible by a signal: `Ok` with
/// its result, or the signal handler's exception (such as `KeyboardInterrupt`) if a signal
/// cancelled it.
pub(crate) fn detach<R: Send>(py: Python<'_>, call: impl FnOnce() -> R + Send) -> PyResult<R> {
    let (result, signal) = py.detach(|| interruptible(call));
    match signal {
        Some(signal) => Err(signal),
        None => Ok(result),
    }
}

/// Runs `call` on this thread, which does not hold the GIL (a LightGBM hook's, which ctypes
/// released it for), interruptible by a signal: its result, and the signal handler's exception
/// where a signal cancelled it.
pub(crate) fn interruptible<R>(call: impl FnOnce() -> R) -> (R, Option<PyErr>) {
    let raised: Arc<Mutex<Option<PyErr>>> = Arc::default();
    let slot = Arc::clone(&raised);
    let cancel = Cancel::checked(move || {
        Python::attach(|py| match py.check_signals() {
            Ok(()) => false,
            Err(signal) => {
                *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(signal);
                true
            }
        })
    });
    let result = cancel.during(call);
    let signal = raised.lock().unwrap_or_else(PoisonError::into_inner).take();
    (result, signal)
}
