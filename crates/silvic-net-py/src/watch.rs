//! `RingWatch`: a ring's progress for another thread (a hang detector), from
//! `TcpCollective.watch()`. It only reads the Rust crate's `silvic_net::RingWatch`; it never
//! holds the GIL across anything but building the dict.

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A ring's progress, readable from any thread while its collective runs; from
/// TcpCollective.watch().
///
/// progress() is what a hang detector polls: the ring's own thread may be blocked in a
/// collective meanwhile (the TcpCollective itself is then borrowed and refuses other threads).
#[pyclass(module = "silvic_net", frozen)]
#[derive(Debug)]
pub(crate) struct RingWatch {
    pub(crate) inner: silvic_net::RingWatch,
}

#[pymethods]
impl RingWatch {
    /// Where the ring stands now, as a dict: "entered" and "completed" (collectives begun and
    /// returned Ok since connect), "index" and "op" of the collective running now and
    /// "in_call" (seconds it has run), all None between calls, "since_return" (seconds since
    /// the last call returned; None before the first) and "failed" (a call failed: the ring is
    /// closed).
    fn progress<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let p = self.inner.progress();
        let now = std::time::Instant::now();
        let out = PyDict::new(py);
        out.set_item("entered", p.entered)?;
        out.set_item("completed", p.completed)?;
        out.set_item("index", p.current.map(|call| call.index))?;
        out.set_item("op", p.current.map(|call| call.op.name()))?;
        let in_call = p.current.map(|call| now.saturating_duration_since(call.since));
        out.set_item("in_call", in_call.map(|d| d.as_secs_f64()))?;
        let since_return = p.last_returned.map(|at| now.saturating_duration_since(at));
        out.set_item("since_return", since_return.map(|d| d.as_secs_f64()))?;
        out.set_item("failed", p.failed)?;
        Ok(out)
    }

    fn __repr__(&self) -> String {
        let p = self.inner.progress();
        format!("RingWatch(entered={}, completed={})", p.entered, p.completed)
    }
}
