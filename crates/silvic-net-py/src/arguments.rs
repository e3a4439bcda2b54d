//! Arguments from Python turned into what the Rust crate takes, refused with a `ValueError`,
//! a `TypeError` or (for what the Rust crate would refuse as an argument of connect) a
//! `ConnectError` naming the argument, before anything is bound or sent.

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use silvic_net::{AllreducePath, ConnectOptions};

/// A duration in seconds from Python, refusing what `Duration` cannot hold.
pub(crate) fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a finite, non-negative number of seconds, got {value}"
        ))
    })
}

/// A `range` (step 1, not empty) or an inclusive `(first, last)` tuple of ports.
pub(crate) fn port_range(ports: &Bound<'_, PyAny>) -> PyResult<std::ops::RangeInclusive<u16>> {
    let bad = || {
        PyValueError::new_err(format!(
            "ports must be a range of ports with step 1, or a (first, last) tuple: {ports}"
        ))
    };
    if ports.is_instance_of::<pyo3::types::PyRange>() {
        let get = |name: &str| -> PyResult<i64> { ports.getattr(name)?.extract() };
        let (start, stop, step) = (get("start")?, get("stop")?, get("step")?);
        if step != 1 || stop <= start {
            return Err(bad());
        }
        let first = u16::try_from(start).map_err(|_| bad())?;
        let last = u16::try_from(stop - 1).map_err(|_| bad())?;
        return Ok(first..=last);
    }
    let (first, last): (u16, u16) = ports.extract().map_err(|_| bad())?;
    Ok(first..=last)
}

/// The options of `connect` and `from_env` from their `allreduce` argument: a path's name
/// (`"auto"`, `"ring"`, `"gather"`, `"bruck"` or `"index"`), else a ConnectError of kind
/// `invalid_argument` naming the argument and the value.
pub(crate) fn connect_options(py: Python<'_>, allreduce: &str) -> PyResult<ConnectOptions> {
    let path: AllreducePath = allreduce.parse().map_err(|_| {
        let names: Vec<&str> = AllreducePath::ALL.iter().map(|p| p.name()).collect();
        let message = format!("allreduce must be one of {}, got {allreduce:?}", names.join(", "));
        crate::errors::invalid_argument(py, message)
    })?;
    Ok(ConnectOptions::new().allreduce(path))
}
