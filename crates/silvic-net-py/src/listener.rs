//! The listener a rank binds before it connects, as Python holds it.

use pyo3::prelude::*;

/// A bound listening socket, to be handed to TcpCollective.connect once.
///
/// Gather every rank's address(), in rank order, and give the list to every rank.
#[pyclass(module = "silvic_net", frozen)]
#[derive(Debug)]
pub(crate) struct RingListener {
    /// `None` once `connect` has taken it.
    pub(crate) inner: std::sync::Mutex<Option<silvic_net::RingListener>>,
    pub(crate) address: String,
}

impl RingListener {
    pub(crate) fn new(listener: silvic_net::RingListener) -> RingListener {
        RingListener { address: listener.address(), inner: Some(listener).into() }
    }
}

#[pymethods]
impl RingListener {
    /// The address other ranks connect to: "ip:port", or "[ip]:port" for IPv6.
    fn address(&self) -> String {
        self.address.clone()
    }

    fn __repr__(&self) -> String {
        let used = self.inner.lock().map(|inner| inner.is_none()).unwrap_or(true);
        format!(
            "RingListener(address={:?}, used={})",
            self.address,
            if used { "True" } else { "False" }
        )
    }
}
