//! A ring's counts as the dicts Python reads (`RingStats`, `PeerStats` in `_types.py`).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// `TcpCollective.stats()`.
pub(crate) fn ring_stats<'py>(
    py: Python<'py>,
    s: &silvic_net::RingStats,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("collectives", s.collectives)?;
    out.set_item("bytes_sent", s.bytes_sent)?;
    out.set_item("bytes_received", s.bytes_received)?;
    out.set_item("waited_left", s.waited_left.as_secs_f64())?;
    out.set_item("waited_right", s.waited_right.as_secs_f64())?;
    Ok(out)
}

/// `TcpCollective.peer_stats()`: a dict per stream, in the ring's order of streams.
pub(crate) fn peer_stats<'py>(
    py: Python<'py>,
    peers: &[silvic_net::PeerStats],
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for p in peers {
        let d = PyDict::new(py);
        d.set_item("peer", p.peer)?;
        d.set_item("offset", p.offset)?;
        d.set_item("bytes_sent", p.bytes_sent)?;
        d.set_item("bytes_received", p.bytes_received)?;
        d.set_item("waited", p.waited.as_secs_f64())?;
        d.set_item("channel", p.channel)?;
        out.append(d)?;
    }
    Ok(out)
}
