//! silvic-net for Python: the `silvic_net._native` extension module behind the `silvic_net`
//! package.
//!
//! A thin mirror of the Rust API: `TcpCollective.bind`, `bind_advertised`,
//! `RingListener.address`, `TcpCollective.connect`, `set_timeout` and the four collectives, with
//! `CollectiveError` and `ConnectError` (both `SilvicError`s) as Python exceptions. It adds no
//! behaviour of its own: every check, timeout and failure path is the Rust crate's. What it adds
//! is only what Python needs:
//!
//! - **Buffers.** Allreduces take a 1-D, C-contiguous, writeable numpy array of the exact dtype
//!   (float64 or int64) and reduce it in place. Anything else raises `TypeError` (not an array,
//!   another dtype) or `ValueError` (another shape, strided, read-only) before a byte is sent,
//!   so a bad argument never desynchronises the ring. The collective runs on a copy of the
//!   array, taken and written back with the GIL held (`buffers.rs`), so nothing another thread
//!   does to the array meanwhile reaches memory the ring uses: while it runs the array is
//!   read-only to Python (`a.flags.writeable` is false: a write through it raises
//!   `ValueError`), writes through another view are overwritten by the result, and an array
//!   resized meanwhile (numpy allows it with `refcheck=False`) gets no result: the call raises,
//!   and the ring closes so that every rank's next call raises too. The array is writeable
//!   again when the call returns, whether it succeeded or raised.
//! - **Logging.** The library's tracing events reach Python's `logging` under the logger
//!   "silvic_net" (and its children, named after the Rust modules): warnings that sum up the
//!   connections refused (at gaps doubling to a minute), for a short job token, for a collective
//!   that waits long. Levels are read when first used and again at every `connect` and
//!   `from_env`.
//! - **The GIL.** It is released while connecting and during every collective, so other Python
//!   threads run while a rank waits on the network. A `TcpCollective` is used by one thread at a
//!   time: a second thread calling it meanwhile gets a `RuntimeError` (already borrowed), and the
//!   array is read-only to other threads while a collective runs on it (see Buffers).
//! - **The listener moves.** `connect` consumes a `RingListener` as the Rust function takes it by
//!   value; giving the same listener to `connect` again raises `ConnectError` (kind
//!   `invalid_argument`).
//!
//! - **Ctrl-C.** `connect`, `from_env` and every collective notice a pending signal within
//!   about 100 ms while they wait (on the main thread, where Python runs signal handlers): the
//!   call ends as a failure does (a ring's error sticks, and the other ranks hear an abort
//!   naming this rank) and raises the handler's exception, `KeyboardInterrupt` for Ctrl-C
//!   (`interrupt.rs`).
//!
//! Not here: no retry, no default timeout, no gathering of addresses (that is the pure-Python
//! `silvic_net.ray` helpers).
#![deny(missing_docs)]
// Only `lightgbm`, the boundary LightGBM's C++ calls across, reads raw pointers.
#![deny(unsafe_code)]

mod arguments;
mod buffers;
mod errors;
mod fixed;
mod interrupt;
mod lightgbm;
mod listener;
mod stats;
mod trainer;
mod watch;

use numpy::Element;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use silvic_net::{Collective, Op};

use arguments::{connect_options, port_range, seconds};
use buffers::{InPlace, reduce_in_place};
use listener::RingListener;
use watch::RingWatch;

/// One rank of a TCP ring: allreduce and allgather across every rank's process.
///
/// Build it with TcpCollective.bind (or bind_advertised), gather every rank's
/// listener.address() in rank order, then TcpCollective.connect on every rank at once.
#[pyclass(module = "silvic_net")]
#[derive(Debug)]
struct TcpCollective {
    /// `None` while the ring is LightGBM's network (`silvic_net.lightgbm.network`).
    inner: Option<silvic_net::TcpCollective>,
    /// The units of the call in which the ring failed (its error sticks and speaks in them on
    /// every later call); `None` before a failure, or where the call passed bytes.
    failed_in: Option<errors::Unit>,
}

impl TcpCollective {
    /// The ring, unless a `silvic_net.lightgbm.network` block holds it.
    fn ring(&mut self) -> PyResult<&mut silvic_net::TcpCollective> {
        self.inner.as_mut().ok_or_else(lightgbm::lent)
    }

    fn ring_ref(&self) -> PyResult<&silvic_net::TcpCollective> {
        self.inner.as_ref().ok_or_else(lightgbm::lent)
    }

    /// A ring of its own: no call made yet.
    fn new(inner: silvic_net::TcpCollective) -> Self {
        TcpCollective { inner: Some(inner), failed_in: None }
    }

    /// Runs `body`, one collective on the ring, with its errors counted in `unit` (elements of
    /// the caller's array; `None` for bytes), or in the units of the call that failed where the
    /// ring failed before: the error that sticks keeps the words it was first raised with.
    pub(crate) fn collective<R>(
        &mut self,
        unit: Option<errors::Unit>,
        body: impl FnOnce(&mut silvic_net::TcpCollective) -> PyResult<R>,
    ) -> PyResult<R> {
        let failed_in = self.failed_in;
        let ring = self.ring()?;
        let watch = ring.watch();
        let failed_before = watch.progress().failed;
        let unit = if failed_before { failed_in } else { unit };
        let result = {
            let _speaking = errors::speak_in(unit, ring.rank());
            body(ring)
        };
        if !failed_before && watch.progress().failed {
            self.failed_in = unit;
        }
        result
    }
}

impl Drop for TcpCollective {
    /// A ring's drop waits, bounded, for its peers to take its last bytes: without the GIL, so
    /// other Python threads run meanwhile.
    fn drop(&mut self) {
        if let Some(ring) = self.inner.take() {
            Python::attach(|py| py.detach(|| drop(ring)));
        }
    }
}

impl TcpCollective {
    fn allreduce<T: Element + Copy + Send>(
        &mut self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        call: InPlace<'_>,
        reduce: fn(
            &mut silvic_net::TcpCollective,
            &mut [T],
        ) -> Result<(), silvic_net::CollectiveError>,
    ) -> PyResult<()> {
        let unit = errors::Unit { dtype: call.dtype, width: size_of::<T>() };
        self.collective(Some(unit), |ring| reduce_in_place(ring, py, buf, call, reduce))
    }
}

#[pymethods]
impl TcpCollective {
    /// Listens on an ephemeral port of host and advertises that address.
    ///
    /// host must be an address other ranks can reach: "0.0.0.0" and "::" are refused (use
    /// bind_advertised to listen on every interface). Raises ConnectError.
    #[staticmethod]
    fn bind(py: Python<'_>, host: &str) -> PyResult<RingListener> {
        let listener =
            silvic_net::TcpCollective::bind(host).map_err(|e| errors::connect(py, &e))?;
        Ok(RingListener::new(listener))
    }

    /// Listens on an ephemeral port of host (such as "0.0.0.0") and advertises node_ip with
    /// that port, for hosts whose reachable address is not the one they listen on.
    /// Raises ConnectError.
    #[staticmethod]
    fn bind_advertised(py: Python<'_>, host: &str, node_ip: &str) -> PyResult<RingListener> {
        let listener = silvic_net::TcpCollective::bind_advertised(host, node_ip)
            .map_err(|e| errors::connect(py, &e))?;
        Ok(RingListener::new(listener))
    }

    /// Listens where the arguments say, for firewalls, several interfaces and NAT.
    ///
    /// Give host (an address or name; "0.0.0.0" with advertise) or interface (such as "eth0":
    /// its first IPv4 address, else its first IPv6 one), not both. advertise is the IP other
    /// ranks connect to, when not the one listened on. port is one port; ports the first free
    /// port of a range, given as a range (range(29500, 29600)) or an inclusive (first, last)
    /// tuple. Raises ConnectError: kind "no_interface" names the interfaces that exist,
    /// "ports_taken" the range whose every port is taken.
    #[staticmethod]
    #[pyo3(signature = (host=None, interface=None, advertise=None, port=None, ports=None))]
    fn bind_with(
        py: Python<'_>,
        host: Option<&str>,
        interface: Option<&str>,
        advertise: Option<&str>,
        port: Option<u16>,
        ports: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<RingListener> {
        let invalid = |message: &str| errors::invalid_argument(py, message.to_string());
        let mut options = match (host, interface) {
            (Some(host), None) => silvic_net::BindOptions::host(host),
            (None, Some(interface)) => silvic_net::BindOptions::interface(interface),
            (None, None) => return Err(invalid("bind_with needs host or interface")),
            (Some(_), Some(_)) => {
                return Err(invalid("bind_with takes host or interface, not both"));
            }
        };
        if let Some(ip) = advertise {
            options = options.advertise(ip);
        }
        options = match (port, ports) {
            (Some(_), Some(_)) => return Err(invalid("bind_with takes port or ports, not both")),
            (Some(port), None) => options.port(port),
            (None, Some(ports)) => options.ports(port_range(ports)?),
            (None, None) => options,
        };
        let listener =
            silvic_net::TcpCollective::bind_with(&options).map_err(|e| errors::connect(py, &e))?;
        Ok(RingListener::new(listener))
    }

    /// Forms the ring from a launcher's environment variables (Slurm, torchrun, a Kubernetes
    /// indexed Job, OpenMPI): SILVIC_RANK/SILVIC_WORLD_SIZE or the launcher's own,
    /// SILVIC_RENDEZVOUS=tcp://HOST:PORT (rank 0's host) or file:///PATH (or MASTER_ADDR and
    /// MASTER_PORT), SILVIC_JOB_TOKEN, and optionally SILVIC_SOCKET_IFNAME, SILVIC_PORTS and
    /// SILVIC_ALLREDUCE.
    ///
    /// timeout (seconds) bounds the whole start, then each collective's wait on a silent peer.
    /// allreduce forces every allreduce's path as for connect. The GIL is released meanwhile.
    /// Raises ConnectError naming the variable or rank at fault.
    #[staticmethod]
    #[pyo3(signature = (timeout, allreduce="auto"))]
    fn from_env(py: Python<'_>, timeout: f64, allreduce: &str) -> PyResult<TcpCollective> {
        let timeout = seconds("timeout", timeout)?;
        let options = connect_options(py, allreduce)?;
        reread_logging_levels();
        interrupt::detach(py, || {
            silvic_net::TcpCollective::from_env_with_options(timeout, &options)
        })?
        .map(TcpCollective::new)
        .map_err(|e| errors::connect(py, &e))
    }

    /// Joins the ring as rank of len(addresses), connecting to rank + 1 and accepting rank - 1.
    ///
    /// addresses holds every rank's listener.address() in rank order, the same list on every
    /// rank. job_token is a secret shared by this ring's ranks: it is proven with a MAC, never
    /// sent, and a rank with another token is refused. timeout (seconds) bounds the whole
    /// rendezvous, then how long a collective waits on a peer that makes no progress.
    ///
    /// allreduce is the path of every allreduce: "auto" (chosen per call from the network,
    /// unless SILVIC_ALLREDUCE forces one), or "ring", "gather", "bruck" or "index", forced
    /// wherever that path can carry the call (else the call takes the automatic path). Every
    /// rank must force the same path, or every rank's connect raises ConnectError of kind
    /// "disagreement" naming the ranks that differ.
    ///
    /// Consumes listener: a listener can be given to connect once. The GIL is released while
    /// the ring forms. Raises ConnectError (with .kind, .peer, .address, .reason).
    #[staticmethod]
    #[pyo3(signature = (listener, rank, addresses, job_token, timeout, allreduce="auto"))]
    fn connect(
        py: Python<'_>,
        listener: &Bound<'_, RingListener>,
        rank: usize,
        addresses: Vec<String>,
        job_token: String,
        timeout: f64,
        allreduce: &str,
    ) -> PyResult<TcpCollective> {
        let timeout = seconds("timeout", timeout)?;
        let options = connect_options(py, allreduce)?;
        let taken = listener.get().inner.lock().ok().and_then(|mut inner| inner.take());
        let Some(taken) = taken else {
            return Err(errors::invalid_argument(
                py,
                format!(
                    "the listener for {} was already given to connect; bind a new one for each ring",
                    listener.get().address
                ),
            ));
        };
        reread_logging_levels();
        interrupt::detach(py, || {
            let (token, addresses) = (&job_token, &addresses);
            silvic_net::TcpCollective::connect_with_options(
                taken, rank, addresses, token, timeout, &options,
            )
        })?
        .map(TcpCollective::new)
        .map_err(|e| errors::connect(py, &e))
    }

    /// Sets how long later collectives wait (seconds) on a peer that makes no progress: an
    /// inactivity bound, not a deadline for the whole call. Zero is taken as one millisecond.
    fn set_timeout(&mut self, timeout: f64) -> PyResult<()> {
        let timeout = seconds("timeout", timeout)?;
        self.ring()?.set_timeout(timeout);
        Ok(())
    }

    /// The current collective timeout, in seconds.
    #[getter]
    fn timeout(&self) -> PyResult<f64> {
        Ok(self.ring_ref()?.timeout().as_secs_f64())
    }

    /// This rank, from 0 to world_size - 1.
    #[getter]
    fn rank(&self) -> PyResult<usize> {
        Ok(self.ring_ref()?.rank())
    }

    /// The number of ranks in the ring.
    #[getter]
    fn world_size(&self) -> PyResult<usize> {
        Ok(self.ring_ref()?.world_size())
    }

    /// What this ring has done since connect, as a dict: "collectives" (calls that returned),
    /// "bytes_sent" and "bytes_received" (ints), and "waited_left" and "waited_right" (seconds
    /// spent waiting on each neighbour, floats).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats::ring_stats(py, &self.ring_ref()?.stats())
    }

    /// The same per stream, a dict for each peer this rank holds a stream to (the two
    /// neighbours, then the chord peers): "peer" (its rank), "offset" (where it sits round the
    /// ring: -1, +1, or a chord's +-2^k), "bytes_sent", "bytes_received", "waited" (seconds)
    /// and "channel" (0, or the channel of a ring split over channels). A world of one has none.
    fn peer_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        stats::peer_stats(py, &self.ring_ref()?.peer_stats())
    }

    /// A handle that shows, from any thread and while a collective runs, which collective this
    /// rank is in and since when (see RingWatch.progress). Take it on the ring's own thread,
    /// before handing the watch to another (a watch taken before the ring is lent to LightGBM
    /// goes on showing its calls).
    fn watch(&self) -> PyResult<RingWatch> {
        Ok(RingWatch { inner: self.ring_ref()?.watch() })
    }

    /// Sums buf (1-D C-contiguous writeable numpy float64) across ranks, in place.
    ///
    /// The result is bitwise identical on every rank. Raises TypeError or ValueError for a bad
    /// array (before anything is sent) and CollectiveError if the ring fails.
    fn allreduce_sum_f64(&mut self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<()> {
        let call = InPlace { name: "allreduce_sum_f64", dtype: "float64", op: Op::AllreduceSumF64 };
        self.allreduce(py, buf, call, |c, b| c.allreduce_sum_f64(b))
    }

    /// Sums buf (1-D C-contiguous writeable numpy int64) across ranks, in place; sums wrap.
    ///
    /// Raises TypeError or ValueError for a bad array (before anything is sent) and
    /// CollectiveError if the ring fails.
    fn allreduce_sum_i64(&mut self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<()> {
        let call = InPlace { name: "allreduce_sum_i64", dtype: "int64", op: Op::AllreduceSumI64 };
        self.allreduce(py, buf, call, |c, b| c.allreduce_sum_i64(b))
    }

    /// Element-wise maximum of buf (1-D C-contiguous writeable numpy float64) across ranks, in
    /// place; NaN propagates.
    ///
    /// Raises TypeError or ValueError for a bad array (before anything is sent) and
    /// CollectiveError if the ring fails.
    fn allreduce_max_f64(&mut self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<()> {
        let call = InPlace { name: "allreduce_max_f64", dtype: "float64", op: Op::AllreduceMaxF64 };
        self.allreduce(py, buf, call, |c, b| c.allreduce_max_f64(b))
    }

    /// Every rank's bytes, as a list indexed by rank. Every rank passes the same length.
    ///
    /// Raises CollectiveError if the ring fails (a rank passing another length included).
    fn allgather_bytes<'py>(
        &mut self,
        py: Python<'py>,
        local: &[u8],
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let blocks = self.collective(None, |ring| {
            interrupt::detach(py, || ring.allgather_bytes(local))?
                .map_err(|e| errors::collective(py, &e))
        })?;
        Ok(blocks.iter().map(|block| PyBytes::new(py, block)).collect())
    }

    /// Reduces buf (numpy float32, float64, int32, int64 or uint64) in place: op "sum", "min"
    /// or "max". Raises TypeError or ValueError for a bad array or op, before anything is sent.
    #[pyo3(name = "allreduce")]
    fn allreduce_typed(
        &mut self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        op: &str,
    ) -> PyResult<()> {
        let unit = trainer::unit(py, buf);
        self.collective(unit, |ring| trainer::allreduce(ring, py, buf, op))
    }

    /// This rank's block of data folded over every rank with fold(acc, next) -> bytes.
    fn reduce_scatter_records<'py>(
        &mut self,
        py: Python<'py>,
        data: &[u8],
        blocks: Vec<usize>,
        record: usize,
        fold: Py<PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.collective(None, |ring| {
            trainer::reduce_scatter_records(ring, py, data, blocks, record, fold)
        })
    }

    /// data (record-byte records) folded over every rank with fold(acc, next) -> bytes.
    fn allreduce_records<'py>(
        &mut self,
        py: Python<'py>,
        data: &[u8],
        record: usize,
        fold: Py<PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.collective(None, |ring| trainer::allreduce_records(ring, py, data, record, fold))
    }

    /// Every rank's bytes, as a list indexed by rank; each rank may pass any length.
    fn allgather_varlen<'py>(
        &mut self,
        py: Python<'py>,
        local: &[u8],
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        self.collective(None, |ring| trainer::allgather_varlen(ring, py, local))
    }

    /// Every rank's block, end to end, given every rank's length and this rank's bytes.
    fn allgather_blocks<'py>(
        &mut self,
        py: Python<'py>,
        local: &[u8],
        blocks: Vec<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.collective(None, |ring| trainer::allgather_blocks(ring, py, local, blocks))
    }

    /// Rank root's data, on every rank (what other ranks pass is discarded).
    fn broadcast_bytes<'py>(
        &mut self,
        py: Python<'py>,
        data: &[u8],
        root: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.collective(None, |ring| trainer::broadcast_bytes(ring, py, data, root))
    }

    fn __repr__(&self) -> String {
        match &self.inner {
            Some(ring) => {
                format!("TcpCollective(rank={}, world_size={})", ring.rank(), ring.world_size())
            }
            None => "TcpCollective(lent to LightGBM)".to_string(),
        }
    }
}

/// The native half of the `silvic_net` package; import `silvic_net`, not this module.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<TcpCollective>()?;
    m.add_class::<RingListener>()?;
    m.add("SilvicError", py.get_type::<errors::SilvicError>())?;
    m.add_class::<RingWatch>()?;
    m.add_class::<fixed::FixedScale>()?;
    m.add_class::<fixed::FixedHistogram>()?;
    m.add("CollectiveError", py.get_type::<errors::CollectiveError>())?;
    m.add("ConnectError", py.get_type::<errors::ConnectError>())?;
    m.add("LIVENESS", silvic_net::LIVENESS.as_secs_f64())?;
    lightgbm::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Another extension in this process may have installed the `log` logger first: then the
    // events go wherever it sends them, and importing this module still succeeds.
    if let Ok(handle) = pyo3_log::Logger::new(py, pyo3_log::Caching::LoggersAndLevels)?.install() {
        let _ = LOGGING.set(handle);
    }
    Ok(())
}

/// Forgets the Python logging levels pyo3-log has cached (it caches them so that an event a
/// level filters out costs no GIL); reset at every `connect` and `from_env`, so levels set
/// since take effect.
static LOGGING: std::sync::OnceLock<pyo3_log::ResetHandle> = std::sync::OnceLock::new();

fn reread_logging_levels() {
    if let Some(handle) = LOGGING.get() {
        handle.reset();
    }
}
