//! Shared helpers for the integration tests: ranks as threads on loopback, bounded in time.
//!
//! Every ring of threads in these tests starts here ([`Ranks`]), so each is bounded the same
//! way: a rank that panics is reported by rank, and one that hangs fails the test at the
//! caller's limit instead of stalling the run. Helpers that the test bed's tests need too (rank
//! processes, the relay) live in `silvic-testbed`, a dev-dependency of this crate.
#![allow(dead_code, reason = "each test binary uses its own part of these helpers")]

use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use silvic_net::{ConnectError, RingListener, TcpCollective};
use silvic_testbed::relay::{Link, Relay};

pub(crate) use silvic_testbed::MARGIN;

/// The rendezvous timeout of rings that are meant to form.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// What a rank's connect returned, and how long it took.
pub(crate) type Joined = (usize, Result<TcpCollective, ConnectError>, Duration);

type Outcome<R> = (usize, Result<R, String>);

/// Ranks as threads of this process, each with its own listener, address list, token and
/// timeout, joined within a limit.
pub(crate) struct Ranks<R> {
    done: Sender<Outcome<R>>,
    results: Receiver<Outcome<R>>,
    started: Vec<usize>,
}

impl<R: Send + 'static> Ranks<R> {
    /// No rank started yet.
    pub(crate) fn new() -> Ranks<R> {
        let (done, results) = mpsc::channel();
        Ranks { done, results, started: Vec::new() }
    }

    /// Starts `rank` in a thread: it connects with `listener`, `addresses`, `token` and
    /// `timeout`, then runs `body` with what connect returned and how long it took.
    pub(crate) fn start(
        &mut self,
        rank: usize,
        listener: RingListener,
        addresses: Vec<String>,
        token: &str,
        timeout: Duration,
        body: impl FnOnce(Result<TcpCollective, ConnectError>, Duration) -> R + Send + 'static,
    ) {
        let (done, token) = (self.done.clone(), token.to_string());
        self.started.push(rank);
        thread::spawn(move || {
            let outcome = catch_unwind(AssertUnwindSafe(move || {
                let started = Instant::now();
                let ring = TcpCollective::connect(listener, rank, &addresses, &token, timeout);
                body(ring, started.elapsed())
            }));
            let _ = done.send((rank, outcome.map_err(|panic| panic_text(&*panic))));
        });
    }

    /// Every started rank's result, in rank order. Panics if a rank panicked (with its
    /// message) or if any is still running `limit` from now (a hang becomes a failure).
    pub(crate) fn join(self, limit: Duration) -> Vec<R> {
        let Ranks { done, results, mut started } = self;
        drop(done);
        started.sort_unstable();
        let deadline = Instant::now() + limit;
        let mut out: Vec<(usize, R)> = Vec::with_capacity(started.len());
        for _ in 0..started.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match results.recv_timeout(left) {
                Ok((rank, Ok(r))) => out.push((rank, r)),
                Ok((rank, Err(panic))) => panic!("rank {rank} panicked: {panic}"),
                Err(_) => {
                    let finished: Vec<usize> = out.iter().map(|(r, _)| *r).collect();
                    let late: Vec<_> = started.iter().filter(|r| !finished.contains(r)).collect();
                    panic!("ranks {late:?} did not finish within {limit:?}");
                }
            }
        }
        out.sort_unstable_by_key(|(rank, _)| *rank);
        out.into_iter().map(|(_, r)| r).collect()
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => text.to_string(),
        (_, Some(text)) => text.clone(),
        _ => "a panic without a message".into(),
    }
}

/// A ring of `world` ranks as threads on 127.0.0.1, each running `body`, all joined within
/// `limit`.
pub(crate) fn ring_of_threads<R: Send + 'static>(
    world: usize,
    limit: Duration,
    body: impl Fn(usize, TcpCollective) -> R + Send + Sync + 'static,
) -> Vec<R> {
    ring_of_threads_with(world, "127.0.0.1", "job-token", CONNECT_TIMEOUT, limit, body)
}

/// Like [`ring_of_threads`], on `host`, with `token` and a rendezvous `timeout`.
pub(crate) fn ring_of_threads_with<R: Send + 'static>(
    world: usize,
    host: &str,
    token: &str,
    timeout: Duration,
    limit: Duration,
    body: impl Fn(usize, TcpCollective) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let listeners: Vec<_> = (0..world).map(|_| TcpCollective::bind(host).unwrap()).collect();
    let addresses: Vec<String> = listeners.iter().map(|l| l.address()).collect();
    ring_of(listeners, &addresses, token, timeout, limit, body)
}

/// A ring of threads over `listeners` (rank `r` takes the `r`-th) and `addresses`.
pub(crate) fn ring_of<R: Send + 'static>(
    listeners: Vec<RingListener>,
    addresses: &[String],
    token: &str,
    timeout: Duration,
    limit: Duration,
    body: impl Fn(usize, TcpCollective) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let body = Arc::new(body);
    let mut ranks = Ranks::new();
    for (rank, listener) in listeners.into_iter().enumerate() {
        let body = body.clone();
        ranks.start(rank, listener, addresses.to_vec(), token, timeout, move |ring, _| {
            body(rank, ring.unwrap_or_else(|e| panic!("rank {rank} connect: {e}")))
        });
    }
    ranks.join(limit)
}

/// `world` listeners on 127.0.0.1 and their addresses, in rank order.
pub(crate) fn listeners(world: usize) -> (Vec<RingListener>, Vec<String>) {
    let listeners: Vec<_> = (0..world).map(|_| TcpCollective::bind("127.0.0.1").unwrap()).collect();
    let addresses = listeners.iter().map(|l| l.address()).collect();
    (listeners, addresses)
}

/// Connects every `(rank, listener)` in its own thread, with the address list, token and
/// timeout `setup(rank)` gives, and returns what each connect returned. Each connect is bounded
/// by its own timeout, the whole by the longest timeout plus [`MARGIN`].
pub(crate) fn connect_each(
    ranks: Vec<(usize, RingListener)>,
    setup: impl Fn(usize) -> (Vec<String>, &'static str, Duration),
) -> Vec<Joined> {
    let mut threads = Ranks::new();
    let mut longest = Duration::ZERO;
    for (rank, listener) in ranks {
        let (addresses, token, timeout) = setup(rank);
        longest = longest.max(timeout);
        threads.start(rank, listener, addresses, token, timeout, move |result, took| {
            (rank, result, took)
        });
    }
    threads.join(longest + MARGIN)
}

/// `world` listeners, rank `behind`'s reached through a relay with `link`: every rank is handed
/// the same address list (the handshake covers the list, so a rank reached at another address
/// by some ranks would be refused). Rank `behind` listens on 127.0.0.1:P and advertises
/// 127.0.0.2:P, where the relay listens and forwards to it; the others are plain listeners.
pub(crate) fn listeners_with_relay(
    world: usize,
    behind: usize,
    link: Link,
) -> (Vec<RingListener>, Vec<String>, Relay) {
    let (mut listeners, _) = listeners(world);
    for _ in 0..50 {
        let listener = TcpCollective::bind_advertised("127.0.0.1", "127.0.0.2").unwrap();
        let port: u16 = listener.address().rsplit(':').next().unwrap().parse().unwrap();
        let (at, target) = (([127, 0, 0, 2], port).into(), ([127, 0, 0, 1], port).into());
        if let Ok(relay) = Relay::start(at, target, link) {
            listeners[behind] = listener;
            let addresses = listeners.iter().map(|l| l.address()).collect();
            return (listeners, addresses, relay);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

/// Where a relay of [`listeners_with_relay`] forwards to: the rank's own listener, for
/// strangers that go around the relay.
pub(crate) fn behind(relay: &Relay) -> std::net::SocketAddr {
    ([127, 0, 0, 1], relay.address().port()).into()
}

/// Log lines of warning level and above, captured in memory for a test to read.
#[derive(Clone, Default)]
pub(crate) struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    /// Forgets what has been logged so far.
    pub(crate) fn clear(&self) {
        self.0.lock().unwrap().clear();
    }

    /// What has been logged so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// A subscriber that writes warnings and errors, without colours, into this capture.
    pub(crate) fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + use<> {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish()
    }
}
