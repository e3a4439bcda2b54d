//! Shared helpers for the integration tests: rings of threads on loopback, bounded in time.
#![allow(dead_code, unreachable_pub)]

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use silvic_net::TcpCollective;

/// A ring of `world` ranks as threads on 127.0.0.1, each running `body`, all joined within
/// `limit` or the test fails (a hang becomes a failure, never a stuck run).
pub fn ring_of_threads<R: Send + 'static>(
    world: usize,
    limit: Duration,
    body: impl Fn(usize, TcpCollective) -> R + Send + Sync + 'static,
) -> Vec<R> {
    ring_of_threads_with(world, "127.0.0.1", "job-token", limit, body)
}

/// Like [`ring_of_threads`], on `host` with `token`.
pub fn ring_of_threads_with<R: Send + 'static>(
    world: usize,
    host: &str,
    token: &str,
    limit: Duration,
    body: impl Fn(usize, TcpCollective) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let listeners: Vec<_> = (0..world).map(|_| TcpCollective::bind(host).unwrap()).collect();
    let addresses: Vec<String> = listeners.iter().map(|l| l.address()).collect();
    let body = std::sync::Arc::new(body);
    let (done, results) = mpsc::channel();
    for (rank, listener) in listeners.into_iter().enumerate() {
        let (addresses, body, done, token) =
            (addresses.clone(), body.clone(), done.clone(), token.to_string());
        thread::spawn(move || {
            let ring =
                TcpCollective::connect(listener, rank, &addresses, &token, Duration::from_secs(20))
                    .unwrap_or_else(|e| panic!("rank {rank} connect: {e}"));
            let _ = done.send((rank, body(rank, ring)));
        });
    }
    drop(done);
    let mut out: Vec<Option<R>> = (0..world).map(|_| None).collect();
    let deadline = std::time::Instant::now() + limit;
    for _ in 0..world {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match results.recv_timeout(left) {
            Ok((rank, r)) => out[rank] = Some(r),
            Err(_) => panic!("ranks did not finish within {limit:?} (a rank panicked or hung)"),
        }
    }
    out.into_iter().map(|r| r.unwrap()).collect()
}

/// `world` listeners on 127.0.0.1 and their addresses, in rank order.
pub fn listeners(world: usize) -> (Vec<silvic_net::RingListener>, Vec<String>) {
    let listeners: Vec<_> = (0..world).map(|_| TcpCollective::bind("127.0.0.1").unwrap()).collect();
    let addresses = listeners.iter().map(|l| l.address()).collect();
    (listeners, addresses)
}

/// What a rank's connect returned, and how long it took.
pub type Joined = (usize, Result<TcpCollective, silvic_net::ConnectError>, Duration);

/// Connects every `(rank, listener)` in its own thread, with the address list, token and
/// timeout `setup(rank)` gives. Each connect is bounded by its own timeout.
pub fn connect_each(
    ranks: Vec<(usize, silvic_net::RingListener)>,
    setup: impl Fn(usize) -> (Vec<String>, &'static str, Duration),
) -> Vec<Joined> {
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|(rank, listener)| {
            let (addresses, token, timeout) = setup(rank);
            thread::spawn(move || {
                let started = std::time::Instant::now();
                let result = TcpCollective::connect(listener, rank, &addresses, token, timeout);
                (rank, result, started.elapsed())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}
