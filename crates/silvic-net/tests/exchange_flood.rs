//! The address exchange under floods: first, strangers from one host (127.0.0.2) open connections to
//! rank 0's exchange port as fast as two threads can, up to 20,000 a second, each sending a
//! valid Hello (the right version and world, a rank of the world) and then holding it or
//! resetting it, while four real ranks (processes of the `from_env` example, on 127.0.0.1)
//! start and form their ring through it.
//!
//! Asserted: every rank forms the ring and computes the right sum. Measured and printed (not
//! asserted: that is a benchmark's job): how long the ranks took from
//! their start, and the strangers' rate while they ran. Bounded: the flood stops when the ranks
//! end or at its own limit, and a rank that has not ended by [`LIMIT`] is killed and fails the
//! test. Their warnings go to stderr, which the test reads only when they end: a rank 0 that
//! logged a line per stranger would fill the pipe and block there.
//!
//! Second, a rank 0 whose stderr nobody reads, and 10,000 strangers: it must meet its deadline
//! (see the test's doc).

mod common;

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use common::MARGIN;
use silvic_net::handshake::Connector;
use socket2::{Domain, Protocol, Socket, Type};

const WORLD: usize = 4;
const TOKEN: &str = "exchange-flood-test-token-0123456789";
/// The strangers' host: one address, not the ranks' (127.0.0.1).
const STRANGERS: &str = "127.0.0.2";
/// The most connections a second the strangers open, all threads together.
const RATE: usize = 20_000;
const FLOOD_THREADS: usize = 2;
/// Connections each flooding thread holds open at once (the oldest is reset for the next): far
/// more than rank 0 holds handshakes for, so it must choose whom to drop.
const HELD_PER_THREAD: usize = 1024;
/// Strangers rank 0's exchange takes before the other ranks start, so they arrive in the middle
/// of the flood.
const HEAD_START_STRANGERS: usize = 3000;
/// The flood's own bound, whatever the ranks do.
const FLOOD_LIMIT: Duration = Duration::from_secs(70);
/// A rank's own timeout (the example's) is 60 s; past this the test kills it and fails.
const LIMIT: Duration = Duration::from_secs(80);

fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps");
    let path = dir.join("examples").join("from_env");
    assert!(path.exists(), "{} is missing: cargo test builds it", path.display());
    path
}

/// Opens strangers until `stop`, at most `rate` a second; returns how many it opened and how
/// many the kernel refused (before rank 0 listens).
fn flood(
    target: SocketAddr,
    rate: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
) -> usize {
    let source: SocketAddr = format!("{STRANGERS}:0").parse().unwrap();
    let started = Instant::now();
    let mut held = VecDeque::with_capacity(HELD_PER_THREAD);
    let (mut sent, mut refused) = (0usize, 0usize);
    let mut noise = seed | 1;
    while !stop.load(Ordering::Relaxed) && started.elapsed() < FLOOD_LIMIT {
        // Pace: no more than `rate` connections a second since the start.
        let due = Duration::from_secs_f64(sent as f64 / rate as f64);
        if let Some(early) = due.checked_sub(started.elapsed()) {
            thread::sleep(early);
        }
        sent += 1;
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        socket.bind(&source.into()).unwrap();
        // Reset on close: no TIME_WAIT, so the strangers' ports never run out.
        socket.set_linger(Some(Duration::ZERO)).unwrap();
        if socket.connect(&target.into()).is_err() {
            refused += 1;
            continue;
        }
        noise ^= noise << 13;
        noise ^= noise >> 7;
        noise ^= noise << 17;
        let rank = 1 + (noise % (WORLD as u64 - 1)) as u32;
        let nonce = noise.to_be_bytes().repeat(2).try_into().unwrap();
        let hello = Connector::start(b"not-the-job-key", [0; 32], WORLD as u32, rank, 0, nonce).1;
        let _ = (&socket).write_all(&hello.encode());
        opened.fetch_add(1, Ordering::Relaxed);
        if held.len() == HELD_PER_THREAD {
            held.pop_front();
        }
        held.push_back(socket);
    }
    refused
}

#[test]
fn four_ranks_form_their_ring_through_a_flood_of_strangers_at_the_exchange() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let target: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let flooders: Vec<_> = (0..FLOOD_THREADS)
        .map(|i| {
            let (stop, opened) = (stop.clone(), opened.clone());
            let rate = RATE / FLOOD_THREADS;
            thread::spawn(move || flood(target, rate, 7919 * (i as u64 + 1), stop, opened))
        })
        .collect();
    let (done, results) = mpsc::channel();
    let mut pids = Vec::new();
    let mut start = |rank: usize| {
        let started = Instant::now();
        let mut child: Child = Command::new(example())
            .env_clear()
            .env("SILVIC_RANK", rank.to_string())
            .env("SILVIC_WORLD_SIZE", WORLD.to_string())
            .env("SILVIC_RENDEZVOUS", format!("tcp://{target}"))
            .env("SILVIC_JOB_TOKEN", TOKEN)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the from_env example");
        pids.push(child.id());
        let done = done.clone();
        thread::spawn(move || {
            let mut out = String::new();
            if let Some(mut o) = child.stdout.take() {
                let _ = o.read_to_string(&mut out);
            }
            let took = started.elapsed();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut out);
            }
            let ok = child.wait().map(|s| s.success()).unwrap_or(false);
            let _ = done.send((rank, ok, out, took));
        });
    };
    // Rank 0 serves the exchange; the others start once the flood has reached it.
    start(0);
    let flooded = Instant::now() + FLOOD_LIMIT / 2;
    let before = opened.load(Ordering::Relaxed);
    while opened.load(Ordering::Relaxed) < before + HEAD_START_STRANGERS {
        assert!(Instant::now() < flooded, "the flood does not reach rank 0");
        thread::sleep(Duration::from_millis(1));
    }
    let ranks_started = Instant::now();
    let opened_at_start = opened.load(Ordering::Relaxed);
    for rank in 1..WORLD {
        start(rank);
    }
    drop(done);
    let deadline = ranks_started + LIMIT;
    let mut outcomes = vec![None; WORLD];
    for _ in 0..WORLD {
        match results.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((rank, ok, out, took)) => outcomes[rank] = Some((ok, out, took)),
            Err(_) => {
                for pid in pids.iter().filter_map(|&p| rustix::process::Pid::from_raw(p as i32)) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
                stop.store(true, Ordering::Relaxed);
                panic!("ranks did not end within {LIMIT:?}: {outcomes:?}");
            }
        }
    }
    let ranks_took = ranks_started.elapsed();
    let strangers_meanwhile = opened.load(Ordering::Relaxed) - opened_at_start;
    stop.store(true, Ordering::Relaxed);
    let refused: usize = flooders.into_iter().map(|f| f.join().expect("flooder")).sum();

    let expected = format!("sum {} (expected {})", 10.0, 10.0);
    let (mut slowest, mut rank0_took) = (Duration::ZERO, Duration::ZERO);
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let (ok, out, took) = outcome.expect("every rank reported");
        assert!(ok, "rank {rank} failed: {out}");
        assert!(out.starts_with(&format!("rank {rank} of {WORLD}: {expected}")), "{out}");
        if rank == 0 {
            rank0_took = took;
        } else {
            slowest = slowest.max(took);
        }
    }
    eprintln!(
        "exchange flood figures: {strangers_meanwhile} strangers while ranks 1-3 ran \
         ({:.0}/s); {refused} refused by the kernel before rank 0 listened; the slowest of \
         ranks 1-3 formed its ring and summed {slowest:?} after its start; rank 0 took {:?}",
        strangers_meanwhile as f64 / ranks_took.as_secs_f64(),
        rank0_took
    );
}

/// Strangers in the second test: as many as the review's flood.
const STRANGERS_UNREAD: usize = 10_000;
/// Rank 0's timeout in the second test: the flood runs through it.
const UNREAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Finding 2 of the review: a launcher that reads a child's stderr only at its exit leaves the
/// pipe full, and a rank 0 that logs a line per stranger then blocks in `write(2)` for ever,
/// where no deadline can fire. Here rank 0 (the `from_env` example, whose tracing subscriber
/// writes warnings to stderr, as a user's would) waits for a rank that never comes while
/// 10,000 strangers reach its exchange, each sending a valid Hello, and nobody reads its
/// stderr: it must still give up at its timeout and say so on stdout.
#[test]
fn rank_0_whose_stderr_nobody_reads_meets_its_deadline_through_10000_strangers() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let target: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let started = Instant::now();
    let mut rank0: Child = Command::new(example())
        .arg(UNREAD_TIMEOUT.as_secs().to_string())
        .env_clear()
        .env("SILVIC_RANK", "0")
        .env("SILVIC_WORLD_SIZE", "2")
        .env("SILVIC_RENDEZVOUS", format!("tcp://{target}"))
        .env("SILVIC_JOB_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped()) // never read while rank 0 runs
        .spawn()
        .expect("start the from_env example");
    let mut stdout = rank0.stdout.take().expect("piped");
    let said = thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    // The strangers, as fast as this thread opens them, each holding its connection until 512
    // newer ones are open.
    let source: SocketAddr = format!("{STRANGERS}:0").parse().unwrap();
    let mut held = VecDeque::new();
    let mut opened = 0;
    let flood_limit = started + UNREAD_TIMEOUT + MARGIN;
    while opened < STRANGERS_UNREAD && Instant::now() < flood_limit {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        socket.bind(&source.into()).unwrap();
        socket.set_linger(Some(Duration::ZERO)).unwrap();
        if socket.connect_timeout(&target.into(), Duration::from_millis(200)).is_err() {
            thread::sleep(Duration::from_millis(1)); // rank 0 not listening yet
            continue;
        }
        let rank = 1;
        let nonce = (opened as u64).to_be_bytes().repeat(2).try_into().unwrap();
        let hello = Connector::start(b"not-the-job-key", [0; 32], 2, rank, 0, nonce).1;
        let _ = (&socket).write_all(&hello.encode());
        opened += 1;
        if held.len() == 512 {
            held.pop_front();
        }
        held.push_back(socket);
    }
    let flooded = started.elapsed();
    // Rank 0 ends by its timeout, plus the margin a loaded machine may take.
    let bound = started + UNREAD_TIMEOUT + MARGIN;
    let ended = loop {
        if let Some(status) = rank0.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() >= bound {
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    if ended.is_none() {
        let _ = rank0.kill();
        let _ = rank0.wait();
    }
    drop(held);
    let mut logged = String::new();
    if let Some(mut stderr) = rank0.stderr.take() {
        let _ = stderr.read_to_string(&mut logged);
    }
    let out = said.join().unwrap();
    eprintln!(
        "unread stderr: {opened} strangers in {flooded:?}; rank 0 ended after {took:?} \
         ({ended:?}), having logged {} lines ({} bytes)",
        logged.lines().count(),
        logged.len()
    );
    assert!(ended.is_some(), "rank 0 did not end within {UNREAD_TIMEOUT:?} + {MARGIN:?}");
    assert_eq!(opened, STRANGERS_UNREAD, "the strangers did not all reach rank 0");
    assert!(out.starts_with("error: timed out"), "rank 0 said: {out}");
    assert!(out.contains("ranks [1] never gave their addresses"), "rank 0 said: {out}");
}
