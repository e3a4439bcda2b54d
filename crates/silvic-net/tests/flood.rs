//! The flood test: hundreds of strangers hit one rank's listener while it forms the ring.
//!
//! A world of three ranks runs as threads in this process, and again a world of eight, where
//! the target also accepts chord streams (from ranks 7 and 5 besides its left neighbour, so
//! it expects a set of ranks); rank 1 is the target, so its real left neighbour is rank 0. A second process (this test binary started again, running
//! [`flood_child`]) opens the strangers, so that this process's descriptors and memory are the
//! rank's alone. The strangers, in a first wave before the real neighbour starts and then as a
//! stream while it connects:
//!
//! - silent ones, which connect and say nothing;
//! - garbage, and a partial message (the magic and a few bytes, then silence);
//! - half a handshake: a valid Hello, then silence;
//! - replays of a handshake captured on the wire from a real ring of the same job;
//! - a peer that claims the right rank (0) with the wrong token;
//! - valid Hellos with wrong claims: another rank, another world size, another version;
//! - connections reset at once.
//!
//! Asserted: the real ring forms within the rendezvous timeout and computes right; no stranger
//! is ever welcomed, and each is refused for the right reason when it is refused at all;
//! descriptors stay within the handshake bound (`MAX_PENDING`) and memory within a few MiB
//! (beyond the buffers of `connect`'s rate probes, where the hop measures long);
//! once the ring is formed the listener is closed (a new connection is refused) and every
//! stranger still held has been closed. Every wait is bounded: a hang fails the test.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::{MARGIN, Ranks};
use silvic_testbed::child::LineChild;
use silvic_testbed::relay::Link;

use silvic_net::handshake::{
    Connector, MAGIC, MESSAGE_LEN, Message, MessageKind, Next, VERSION, roster_digest,
};
use silvic_net::{Collective, RejectReason, TcpCollective};

/// The rank under attack; its left neighbour is rank 0.
const TARGET: usize = 1;
const TOKEN: &str = "flood-job-token";
/// The rendezvous timeout every rank is given.
const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(60);
/// Strangers of each kind in the first wave.
const PER_KIND: usize = 60;
/// Threads of the second wave, the stream of strangers the real neighbour connects through.
const STREAM_THREADS: usize = 2;
/// The most strangers each stream thread opens.
const STREAM_MAX: usize = 1500;
/// Strangers the stream opens before the real neighbour starts.
const STREAM_HEAD_START: usize = 200;
/// What the rendezvous holds at most (`MAX_PENDING` in src/rendezvous/accept.rs).
const MAX_PENDING: usize = 256;
/// Descriptors the process may open beyond the handshakes it holds, in a world of `world`:
/// every rank's listener, streams (two, or with chords `2 ceil(log2 n) - 1`) and a dialling
/// socket, the child's pipes, the monitor's directory handle and a few more (24 at world 3).
fn fd_slack(world: usize) -> usize {
    let streams = if world >= 8 { 2 * world.next_power_of_two().ilog2() as usize - 1 } else { 2 };
    12 + world * (streams + 2)
}
/// How much the process's resident memory may grow during the flood, beyond what `connect`'s
/// rate probes hold ([`rate_probes_kib`]).
const RSS_GROWTH_LIMIT_KIB: u64 = 2 * 1024;
/// What `connect`'s probes may hold in a world of `world` ranks in this process, in KiB: per
/// rank the two frame buffers of a shift (256 KiB each, however long the shift: src/probe.rs)
/// and the fold probe's blocks (160 KiB). Ours to bound, whatever the strangers do.
fn rate_probes_kib(world: usize) -> u64 {
    world as u64 * (2 * 256 + 160)
}

const CHILD_ENV: &str = "SILVIC_FLOOD_TARGET";
const WORLD_ENV: &str = "SILVIC_FLOOD_WORLD";
const REPLAY_ENV: &str = "SILVIC_FLOOD_REPLAY";
const ROSTER_ENV: &str = "SILVIC_FLOOD_ROSTER";

/// The flood ring's roster digest, as the child was told it: strangers that know the address
/// list send valid Hellos.
static ROSTER: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
/// The flood ring's world size, as the child was told it.
static WORLD: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

fn world() -> u32 {
    *WORLD.get().expect("the child knows the world size")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Silent,
    Garbage,
    Partial,
    HalfHandshake,
    Replay,
    WrongToken,
    WrongClaims,
    Reset,
}

const KINDS: [Kind; 8] = [
    Kind::Silent,
    Kind::Garbage,
    Kind::Partial,
    Kind::HalfHandshake,
    Kind::Replay,
    Kind::WrongToken,
    Kind::WrongClaims,
    Kind::Reset,
];

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with(field)).expect("field in /proc/self/status");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a number of kB")
}

/// Resets the kernel's record of peak resident memory (VmHWM) to the current value.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Samples descriptors and resident memory until stopped; returns the peaks.
struct Monitor {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<(usize, u64)>,
}

impl Monitor {
    fn start() -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = thread::spawn(move || {
            let (mut fds, mut rss) = (0, 0);
            while !flag.load(Ordering::Relaxed) {
                fds = fds.max(open_fds());
                rss = rss.max(status_kib("VmRSS:"));
                thread::sleep(Duration::from_millis(1));
            }
            (fds, rss)
        });
        Monitor { stop, handle }
    }

    fn stop(self) -> (usize, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("monitor")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

/// Runs a real ring of this job (same token, world and ranks) with rank 0's connection to rank 1
/// through a recording relay, and returns what rank 0 sent in its handshake: Hello and Proof.
fn capture_a_valid_handshake(world: usize) -> Vec<u8> {
    // Every rank that dials rank 1 reaches it through the relay: rank 0, and with chords
    // ranks 7 and 5 too.
    let link = Link { record: 2 * MESSAGE_LEN, ..Link::default() };
    let (listeners, addresses, relay) = common::listeners_with_relay(world, 1, link);

    let mut ranks = Ranks::new();
    for (rank, listener) in listeners.into_iter().enumerate() {
        let list = addresses.clone();
        ranks.start(rank, listener, list, TOKEN, RENDEZVOUS_TIMEOUT, |ring, _| {
            let mut x = vec![1.0; 100];
            ring.unwrap().allreduce_sum_f64(&mut x).unwrap();
            x[0]
        });
    }
    let sums = ranks.join(RENDEZVOUS_TIMEOUT + MARGIN);
    assert_eq!(sums, vec![world as f64; world], "the capture ring");
    let hello_of = |record: &[u8]| {
        let first = record.get(..MESSAGE_LEN)?.try_into().ok()?;
        Message::decode(first).ok()
    };
    let records = relay.recorded();
    let captured = records
        .into_iter()
        .find(|r| hello_of(r).is_some_and(|hello| hello.rank == 0))
        .expect("rank 0 went through the relay");
    assert_eq!(captured.len(), 2 * MESSAGE_LEN, "rank 0 sent a whole handshake");
    let hello = Message::decode(captured[..MESSAGE_LEN].try_into().unwrap()).unwrap();
    let proof = Message::decode(captured[MESSAGE_LEN..].try_into().unwrap()).unwrap();
    assert_eq!((hello.kind, hello.rank, hello.world), (MessageKind::Hello, 0, world as u32));
    assert_eq!(proof.kind, MessageKind::Proof);
    captured
}

/// One line the child reports per kind: `FLOOD <kind> key=value ...`.
#[derive(Debug, Default)]
struct Tally {
    opened: usize,
    refused_by_kernel: usize,
    challenged: usize,
    rejected: usize,
    closed: usize,
    still_open: usize,
    welcomed: usize,
    unexpected: usize,
}

impl Tally {
    fn parse(line: &str) -> (String, Tally) {
        let mut parts = line.split_whitespace().skip(1);
        let kind = parts.next().unwrap().to_string();
        let mut t = Tally::default();
        for part in parts {
            let (key, value) = part.split_once('=').unwrap();
            let value: usize = value.parse().unwrap();
            match key {
                "opened" => t.opened = value,
                "refused_by_kernel" => t.refused_by_kernel = value,
                "challenged" => t.challenged = value,
                "rejected" => t.rejected = value,
                "closed" => t.closed = value,
                "still_open" => t.still_open = value,
                "welcomed" => t.welcomed = value,
                "unexpected" => t.unexpected = value,
                other => panic!("unknown key {other}"),
            }
        }
        (kind, t)
    }

    fn line(&self, kind: &str) -> String {
        format!(
            "FLOOD {kind} opened={} refused_by_kernel={} challenged={} rejected={} closed={} \
             still_open={} welcomed={} unexpected={}",
            self.opened,
            self.refused_by_kernel,
            self.challenged,
            self.rejected,
            self.closed,
            self.still_open,
            self.welcomed,
            self.unexpected
        )
    }
}

enum Event {
    /// A rank's connect returned, at this instant.
    Connected(usize, Result<Instant, String>),
    /// A rank's collectives finished with this allgather.
    Finished(usize, Result<Vec<Vec<u8>>, String>),
}

/// Starts `rank`: it connects, reports, and waits for `go` before its collectives, so that the
/// memory measured is the rendezvous's.
fn start_rank(
    ranks: &mut Ranks<()>,
    rank: usize,
    listener: silvic_net::RingListener,
    addresses: Vec<String>,
    events: mpsc::Sender<Event>,
    go: Receiver<()>,
) {
    ranks.start(rank, listener, addresses, TOKEN, RENDEZVOUS_TIMEOUT, move |ring, _| {
        let mut ring = match ring {
            Ok(ring) => {
                let _ = events.send(Event::Connected(rank, Ok(Instant::now())));
                ring
            }
            Err(e) => {
                let _ = events.send(Event::Connected(rank, Err(e.to_string())));
                return;
            }
        };
        if go.recv().is_err() {
            return;
        }
        let outcome = (|| {
            let mut sums = vec![rank as f64 + 1.0; 50_000];
            ring.allreduce_sum_f64(&mut sums).map_err(|e| e.to_string())?;
            let world = ring.world_size();
            if sums.iter().any(|&x| x != (world * (world + 1) / 2) as f64) {
                return Err("wrong allreduce result".to_string());
            }
            ring.allgather_bytes(&[rank as u8; 5]).map_err(|e| e.to_string())
        })();
        let _ = events.send(Event::Finished(rank, outcome));
    });
}

/// The tests of this file measure the whole process: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn a_flood_of_strangers_during_rendezvous_does_not_stop_the_ring() {
    flood_case(3);
}

#[test]
fn a_flood_of_strangers_during_rendezvous_does_not_stop_a_ring_with_chords() {
    flood_case(8);
}

/// The flood test in a world of `world` (see the module doc).
fn flood_case(world: usize) {
    let _serial = serial();
    let limit = Instant::now() + Duration::from_secs(150);
    let replay = capture_a_valid_handshake(world);

    let (listeners, addresses) = common::listeners(world);
    let target = addresses[TARGET].clone();
    let parsed: Vec<SocketAddr> = addresses.iter().map(|a| a.parse().unwrap()).collect();

    let fds_before = open_fds();
    let peak_reset = reset_peak_rss();
    let rss_before = status_kib("VmRSS:");
    let mut monitor = Some(Monitor::start());

    // Every rank but 0 starts: rank 1 is accepting (and the others dialling, some of them the
    // absent rank 0).
    let (events, event_rx) = mpsc::channel();
    let mut listeners: Vec<Option<_>> = listeners.into_iter().map(Some).collect();
    let mut go = Vec::new();
    let mut ranks = Ranks::new();
    let mut start = |rank: usize, listener| {
        let (go_tx, go_rx) = mpsc::channel();
        go.push(go_tx);
        start_rank(&mut ranks, rank, listener, addresses.clone(), events.clone(), go_rx);
    };
    for (rank, listener) in listeners.iter_mut().enumerate().skip(1) {
        start(rank, listener.take().unwrap());
    }

    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "flood_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &target)
        .env(WORLD_ENV, world.to_string())
        .env(REPLAY_ENV, hex(&replay))
        .env(ROSTER_ENV, hex(&roster_digest(&parsed)));
    let mut child = LineChild::spawn("the flooding process", command).unwrap();
    eprintln!("{}", child.wait_for(&["FLOOD wave1"], limit).unwrap().text);
    eprintln!("{}", child.wait_for(&["FLOOD streaming"], limit).unwrap().text);
    // The real neighbour arrives in the middle of the flood.
    let rank0_started = Instant::now();
    start(0, listeners[0].take().unwrap());

    let mut connected = vec![None; world];
    let mut finished: Vec<Option<Vec<Vec<u8>>>> = vec![None; world];
    let mut refused_after = None;
    let mut peaks = None;
    while finished.iter().any(Option::is_none) {
        if peaks.is_none() && connected.iter().all(Option::is_some) {
            // The ring is formed: take the rendezvous's peaks, then let the ranks compute.
            let (fds, sampled_rss) = monitor.take().unwrap().stop();
            let rss = if peak_reset { status_kib("VmHWM:") } else { sampled_rss };
            peaks = Some((fds, rss));
            for g in &go {
                g.send(()).unwrap();
            }
        }
        let left = limit.saturating_duration_since(Instant::now());
        match event_rx.recv_timeout(left).expect("every rank connects and finishes in time") {
            Event::Connected(rank, outcome) => {
                let at = outcome.unwrap_or_else(|e| panic!("rank {rank} connect failed: {e}"));
                connected[rank] = Some(at);
                if rank == TARGET {
                    // The listener is closed once the ring is formed: a new connection is refused.
                    let refused = TcpStream::connect(&target).map(|_| ()).map_err(|e| e.kind());
                    refused_after = Some(refused);
                    child.send("formed").expect("tell the flooding process");
                }
            }
            Event::Finished(rank, outcome) => {
                finished[rank] =
                    Some(outcome.unwrap_or_else(|e| panic!("rank {rank} collectives: {e}")));
            }
        }
    }
    let formed_in = connected.iter().map(|at| at.unwrap()).max().unwrap() - rank0_started;

    let mut tallies = Vec::new();
    loop {
        let line = child.wait_for(&["FLOOD"], limit).unwrap().text;
        if line.starts_with("FLOOD end") {
            break;
        }
        eprintln!("{line}");
        tallies.push(Tally::parse(&line));
    }
    let (peak_fds, peak_rss) = peaks.expect("measured once the ring formed");
    let status = child.wait_exit(MARGIN).expect("the flooding process exits");
    eprint!("{}", child.stderr());
    assert!(status.success(), "the flooding process failed: {status}");
    ranks.join(MARGIN);

    let total: usize = tallies.iter().map(|(_, t)| t.opened).sum();
    let rss_growth = peak_rss.saturating_sub(rss_before);
    eprintln!(
        "flood figures: {total} strangers; ring formed {formed_in:?} after rank 0 started; \
         descriptors {fds_before} before, peak {peak_fds} (bound {}); resident memory {} KiB \
         before, peak {} KiB (+{} KiB{})",
        fds_before + MAX_PENDING + fd_slack(world),
        rss_before,
        peak_rss,
        rss_growth,
        if peak_reset { ", VmHWM" } else { ", sampled" }
    );

    let expected: Vec<Vec<u8>> = (0..world).map(|r| vec![r as u8; 5]).collect();
    for (rank, gathered) in finished.iter().enumerate() {
        assert_eq!(gathered.as_ref(), Some(&expected), "rank {rank}");
    }
    assert_eq!(refused_after, Some(Err(ErrorKind::ConnectionRefused)), "listener still open");
    assert!(formed_in < RENDEZVOUS_TIMEOUT, "{formed_in:?}");
    assert!(total >= KINDS.len() * PER_KIND, "only {total} strangers were opened");
    assert!(
        peak_fds <= fds_before + MAX_PENDING + fd_slack(world),
        "descriptors grew from {fds_before} to {peak_fds} with {total} strangers"
    );
    let rss_limit = RSS_GROWTH_LIMIT_KIB + rate_probes_kib(world);
    assert!(rss_growth <= rss_limit, "memory grew by {rss_growth} KiB (bound {rss_limit})");
    let mut rejected = 0;
    for (kind, t) in &tallies {
        assert_eq!(t.welcomed, 0, "{kind}: a stranger was welcomed into the ring");
        assert_eq!(t.unexpected, 0, "{kind}: a stranger got an unexpected answer");
        assert_eq!(t.still_open, 0, "{kind}: strangers still held after the ring formed");
        rejected += t.rejected;
    }
    // The handshake strangers that were not dropped for room were refused with a reason.
    assert!(rejected > 0, "no stranger was told why it was refused");
}

/// What a scanner has done: connections opened, and when it opened the last one (nanoseconds
/// after it started).
#[derive(Default)]
struct Scanned {
    opened: AtomicUsize,
    last_open_ns: AtomicU64,
}

/// A port scanner that does not stop: connections opened as fast as `threads` threads can, each
/// held silent (the newest `hold` per thread) until `stop`, counted in `scanned`.
fn silent_flood(
    target: String,
    threads: usize,
    hold: usize,
    stop: Arc<AtomicBool>,
    scanned: Arc<Scanned>,
) -> JoinHandle<()> {
    let started = Instant::now();
    thread::spawn(move || {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (target, stop, scanned) = (target.clone(), stop.clone(), scanned.clone());
                thread::spawn(move || {
                    let mut held = std::collections::VecDeque::with_capacity(hold);
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(s) = TcpStream::connect(&target) {
                            scanned.opened.fetch_add(1, Ordering::Relaxed);
                            let at = started.elapsed().as_nanos() as u64;
                            scanned.last_open_ns.fetch_max(at, Ordering::Relaxed);
                            if held.len() == hold {
                                held.pop_front();
                            }
                            held.push_back(s);
                        }
                        // Paced below what the listener accepts, so that its queue never
                        // fills: a full queue would stall the scanner in SYN retransmission.
                        thread::sleep(Duration::from_millis(1));
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
    })
}

/// A neighbour on a slow link takes a round trip to prove itself after its Hello. A scanner
/// that opens more than [`MAX_PENDING`] silent connections per round trip must not push it out:
/// silent connections are dropped for room before one that sent a valid Hello.
#[test]
fn a_neighbour_on_a_slow_link_is_not_pushed_out_by_a_silent_flood() {
    let _serial = serial();
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(std::io::stderr)
        .try_init();
    let (stop, scanned) = (Arc::new(AtomicBool::new(false)), Arc::new(Scanned::default()));
    // Rank 0 reaches rank 1 through a link with 250 ms of delay each way: after its Hello, the
    // neighbour's proof comes one round trip, half a second, later. The scanner goes straight
    // to rank 1.
    let delay = Duration::from_millis(250);
    let link = Link { delay, ..Link::default() };
    let (listeners, addresses, relay) = common::listeners_with_relay(2, 1, link);
    let direct = common::behind(&relay).to_string();
    // The rendezvous timeout: the ring forms in about a second (a round trip and the
    // handshakes); this only bounds the test if it does not.
    let timeout = MARGIN;
    let mut listeners = listeners.into_iter();
    let (rank0, rank1) = (listeners.next().unwrap(), listeners.next().unwrap());
    let mut ranks = Ranks::new();
    let outcome = |ring: Result<TcpCollective, _>, took| ring.map(|_| took);
    // Rank 1 accepts first, the flood starts, and rank 0 joins once its table is full.
    ranks.start(1, rank1, addresses.clone(), TOKEN, timeout, outcome);
    let flood_started = Instant::now();
    let flood = silent_flood(direct, 2, 1000, stop.clone(), scanned.clone());
    while scanned.opened.load(Ordering::Relaxed) < MAX_PENDING {
        assert!(flood_started.elapsed() < timeout, "the silent flood does not flow");
        thread::sleep(Duration::from_millis(1));
    }
    ranks.start(0, rank0, addresses, TOKEN, timeout, outcome);
    let outcomes = ranks.join(timeout + MARGIN);
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    let opened = scanned.opened.load(Ordering::Relaxed);
    // The scanner's rate while rank 1 listened: once the ring has formed, its listener is
    // closed and the scanner opens nothing more, however long connect goes on.
    let flooded_for = Duration::from_nanos(scanned.last_open_ns.load(Ordering::Relaxed));
    eprintln!("silent flood: {opened} connections in {flooded_for:?}; connect: {outcomes:?}");
    // The test means something only if the scanner is fast enough to have pushed the neighbour
    // out by age alone: more than MAX_PENDING connections per round trip.
    let per_round_trip = opened as f64 * (2 * delay).as_secs_f64() / flooded_for.as_secs_f64();
    assert!(per_round_trip > MAX_PENDING as f64, "the scanner was too slow: {per_round_trip:.0}");
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    }
}

/// How many connections wait in the accept queue of the loopback listener on `port`, from the
/// kernel's table (for a listening socket, the `rx_queue` column counts them).
fn accept_queue(port: u16) -> Option<usize> {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().find_map(|table| {
        let text = std::fs::read_to_string(table).ok()?;
        text.lines().skip(1).find_map(|row| {
            let cols: Vec<&str> = row.split_whitespace().collect();
            let local_port = cols.get(1)?.rsplit(':').next()?;
            let listening = cols.get(3) == Some(&"0A");
            if !listening || u16::from_str_radix(local_port, 16).ok()? != port {
                return None;
            }
            usize::from_str_radix(cols.get(4)?.split(':').nth(1)?, 16).ok()
        })
    })
}

/// Strangers that arrive between `bind` and `connect` wait in the kernel's accept queue. Once
/// that queue is full the kernel drops new SYNs, the neighbour's among them, and the neighbour
/// then waits out TCP's retransmission (a second, then three, then seven). The listener's
/// queue holds hundreds, so a scan before `connect` costs the neighbour nothing: its
/// connection joins the queue behind every stranger at its first SYN.
#[test]
fn strangers_queued_before_connect_do_not_delay_the_neighbour() {
    let _serial = serial();
    let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .map_or(4096, |s| s.trim().parse().unwrap_or(4096));
    let strangers = 600.min(somaxconn.saturating_sub(8));
    let (listeners, addresses) = common::listeners(2);
    let target: SocketAddr = addresses[1].parse().unwrap();
    let mut held = Vec::new();
    for _ in 0..strangers {
        let stream = TcpStream::connect_timeout(&target, Duration::from_secs(3));
        held.push(stream.expect("the accept queue takes every stranger"));
    }
    assert_eq!(accept_queue(target.port()), Some(strangers), "every stranger waits in the queue");

    // Rank 0 dials; only once its connection waits in the queue does rank 1 start accepting.
    let mut listeners = listeners.into_iter();
    let mut ranks = Ranks::new();
    let rank0_started = Instant::now();
    ranks.start(0, listeners.next().unwrap(), addresses.clone(), TOKEN, RENDEZVOUS_TIMEOUT, {
        |ring, _| drop(ring.unwrap_or_else(|e| panic!("rank 0: {e}")))
    });
    let queued = loop {
        if accept_queue(target.port()) == Some(strangers + 1) {
            break rank0_started.elapsed();
        }
        assert!(rank0_started.elapsed() < MARGIN, "rank 0 never reached rank 1's queue");
        thread::sleep(Duration::from_millis(2));
    };
    ranks.start(1, listeners.next().unwrap(), addresses, TOKEN, RENDEZVOUS_TIMEOUT, {
        |ring, _| drop(ring.unwrap_or_else(|e| panic!("rank 1: {e}")))
    });
    ranks.join(RENDEZVOUS_TIMEOUT + MARGIN);
    eprintln!(
        "{strangers} strangers queued; rank 0 queued behind them {queued:?} after it started"
    );
    // A dropped SYN is sent again only after TCP's initial retransmission timeout, one second:
    // the neighbour is queued at its first SYN or at least a second late.
    assert!(queued < Duration::from_secs(1), "rank 0's first SYN was dropped: {queued:?}");
    drop(held);
}

// ---------------------------------------------------------------------------------------------
// The flooding process.

/// A tiny deterministic generator for garbage and nonces.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        std::array::from_fn(|_| self.next() as u8)
    }
}

/// A stranger's connection and what it has heard so far.
struct Stranger {
    kind: Kind,
    stream: Option<TcpStream>,
    heard: Vec<u8>,
    refused_by_kernel: bool,
}

/// Starts a handshake as `rank` of `world` towards the target, holding `token`.
fn start(
    token: &'static str,
    world: u32,
    rank: u32,
    noise: &mut Noise,
) -> (Connector<'static>, Message) {
    let roster = *ROSTER.get().expect("the child knows the roster");
    Connector::start(token.as_bytes(), roster, world, rank, TARGET as u32, noise.bytes())
}

/// Reads one whole message, or returns `None` if the connection ends or stays silent.
fn read_message(stream: &mut TcpStream, heard: &mut Vec<u8>) -> Option<Message> {
    let mut buf = [0u8; MESSAGE_LEN];
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.read_exact(&mut buf).ok()?;
    heard.extend_from_slice(&buf);
    Message::decode(&buf).ok()
}

fn open_stranger(kind: Kind, target: SocketAddr, replay: &[u8], noise: &mut Noise) -> Stranger {
    let mut s = Stranger { kind, stream: None, heard: Vec::new(), refused_by_kernel: false };
    let mut stream = match TcpStream::connect_timeout(&target, Duration::from_secs(3)) {
        Ok(stream) => stream,
        Err(_) => {
            s.refused_by_kernel = true;
            return s;
        }
    };
    // Write errors mean the listener already dropped this stranger: that is allowed.
    let _ = match kind {
        Kind::Silent => Ok(()),
        Kind::Garbage => {
            let mut junk: [u8; 200] = noise.bytes();
            junk[0] = b'G';
            stream.write_all(&junk)
        }
        Kind::Partial => {
            let mut part = [0u8; 40];
            part[..8].copy_from_slice(&MAGIC);
            stream.write_all(&part)
        }
        Kind::HalfHandshake => stream.write_all(&start(TOKEN, world(), 0, noise).1.encode()),
        Kind::Replay => stream.write_all(replay),
        Kind::WrongToken => {
            // Claims to be rank 0, the right neighbour, and answers the challenge honestly, but
            // holds another token.
            let (mut role, hello) = start("not-the-job-token", world(), 0, noise);
            stream.write_all(&hello.encode()).and_then(|()| {
                match read_message(&mut stream, &mut s.heard).map(|m| role.on_message(&m)) {
                    Some(Next::Send(proof)) => stream.write_all(&proof.encode()),
                    _ => Ok(()),
                }
            })
        }
        Kind::WrongClaims => {
            // Holds the token, but is another rank, or from another world, or another version.
            let mut hello = match noise.next() % 3 {
                0 => start(TOKEN, world(), 2, noise).1,
                1 => start(TOKEN, world() + 1, 0, noise).1,
                _ => start(TOKEN, world(), 0, noise).1,
            };
            if hello.rank == 0 && hello.world == world() {
                hello.version = VERSION + 1;
            }
            stream.write_all(&hello.encode())
        }
        Kind::Reset => {
            let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
            drop(stream);
            return s;
        }
    };
    s.stream = Some(stream);
    s
}

/// How a stranger's conversation must look: what the listener may answer each kind.
fn judge(s: &Stranger, tally: &mut Tally) {
    let messages: Vec<Message> = s
        .heard
        .chunks(MESSAGE_LEN)
        .map(|c| c.try_into().ok().and_then(|c| Message::decode(c).ok()))
        .collect::<Option<_>>()
        .unwrap_or_else(|| {
            tally.unexpected += 1;
            Vec::new()
        });
    let kinds: Vec<MessageKind> = messages.iter().map(|m| m.kind).collect();
    if kinds.contains(&MessageKind::Welcome) {
        tally.welcomed += 1;
    }
    if kinds.first() == Some(&MessageKind::Challenge) {
        tally.challenged += 1;
    }
    let challenge = MessageKind::Challenge;
    let token = MessageKind::Reject(RejectReason::TokenMismatch);
    let allowed = match s.kind {
        Kind::Silent | Kind::Garbage | Kind::Partial | Kind::Reset => kinds.is_empty(),
        Kind::HalfHandshake => kinds.is_empty() || kinds == [challenge],
        // The replay was captured from a ring of the same job on other ports: its Hello names
        // another address list.
        Kind::Replay => {
            kinds.is_empty()
                || kinds == [MessageKind::Reject(RejectReason::AddressMismatch)]
                || kinds == [challenge]
                || kinds == [challenge, token]
        }
        Kind::WrongToken => kinds.is_empty() || kinds == [challenge] || kinds == [challenge, token],
        Kind::WrongClaims => {
            kinds.is_empty()
                || matches!(
                    kinds[..],
                    [MessageKind::Reject(
                        RejectReason::WrongRank
                            | RejectReason::WorldMismatch
                            | RejectReason::VersionMismatch
                    )]
                )
        }
    };
    if !allowed {
        eprintln!("flood: {:?} heard {kinds:?}", s.kind);
        tally.unexpected += 1;
    }
    if kinds.iter().any(|k| matches!(k, MessageKind::Reject(_))) {
        tally.rejected += 1;
    }
}

/// Opens `count` strangers of `kind` (or of every kind in turn, for `None`) until `stop`.
fn flood(
    kind: Option<Kind>,
    count: usize,
    target: SocketAddr,
    replay: Arc<Vec<u8>>,
    seed: u64,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
) -> Vec<Stranger> {
    let mut noise = Noise(seed | 1);
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let kind = kind.unwrap_or(KINDS[i % KINDS.len()]);
        out.push(open_stranger(kind, target, &replay, &mut noise));
        opened.fetch_add(1, Ordering::Relaxed);
    }
    out
}

/// The flooding process: not a test of its own, it is started by the test above.
#[test]
#[ignore = "the flooding process of the flood test, which starts it"]
fn flood_child() {
    let target: SocketAddr = std::env::var(CHILD_ENV)
        .expect("started by a_flood_of_strangers_during_rendezvous_does_not_stop_the_ring")
        .parse()
        .unwrap();
    let replay = Arc::new(unhex(&std::env::var(REPLAY_ENV).unwrap()));
    let roster = unhex(&std::env::var(ROSTER_ENV).unwrap());
    ROSTER.set(roster.try_into().expect("32 bytes")).unwrap();
    WORLD.set(std::env::var(WORLD_ENV).unwrap().parse().expect("a world size")).unwrap();
    // Ends the test harness's own "test flood_child ... " line, so each report starts a line.
    println!();
    let opened = Arc::new(AtomicUsize::new(0));
    let never = Arc::new(AtomicBool::new(false));

    // Wave one: every kind at once, before the real neighbour starts.
    let wave: Vec<_> = KINDS
        .iter()
        .enumerate()
        .map(|(i, &kind)| {
            let (replay, never, opened) = (replay.clone(), never.clone(), opened.clone());
            thread::spawn(move || {
                flood(Some(kind), PER_KIND, target, replay, i as u64 * 7919, never, opened)
            })
        })
        .collect();
    let mut strangers: Vec<Stranger> =
        wave.into_iter().flat_map(|h| h.join().expect("wave one")).collect();
    println!("FLOOD wave1 strangers={}", strangers.len());

    // Wave two: a stream of strangers of every kind, from two threads, until the parent says
    // the ring is formed. The real neighbour starts once the stream flows.
    let stop = Arc::new(AtomicBool::new(false));
    let streams: Vec<_> = (0..STREAM_THREADS)
        .map(|i| {
            let (replay, stop, opened) = (replay.clone(), stop.clone(), opened.clone());
            let seed = 104_729 * (i as u64 + 1);
            thread::spawn(move || flood(None, STREAM_MAX, target, replay, seed, stop, opened))
        })
        .collect();
    let flowing = Instant::now() + Duration::from_secs(30);
    while opened.load(Ordering::Relaxed) < strangers.len() + STREAM_HEAD_START {
        assert!(Instant::now() < flowing, "the stream of strangers does not flow");
        thread::sleep(Duration::from_millis(1));
    }
    println!("FLOOD streaming strangers={}", opened.load(Ordering::Relaxed));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("the parent's word");
    assert_eq!(line.trim(), "formed", "the parent gave up");
    let formed = Instant::now();
    stop.store(true, Ordering::Relaxed);
    for stream in streams {
        strangers.extend(stream.join().expect("wave two"));
    }

    // Every stranger still held must find its connection closed: evicted, refused, timed out,
    // or dropped when the ring formed. Drain what each heard, within one shared deadline.
    // The ring closed them before the parent said "formed": the deadline only bounds the check.
    let deadline = formed + MARGIN;
    let mut tallies: Vec<(Kind, Tally)> = KINDS.iter().map(|&k| (k, Tally::default())).collect();
    for s in &mut strangers {
        let tally = &mut tallies.iter_mut().find(|(k, _)| *k == s.kind).unwrap().1;
        tally.opened += 1;
        if s.refused_by_kernel {
            tally.refused_by_kernel += 1;
            continue;
        }
        if let Some(stream) = &mut s.stream {
            let mut closed = false;
            let mut buf = [0u8; 512];
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                stream.set_read_timeout(Some(left.max(Duration::from_millis(1)))).unwrap();
                match stream.read(&mut buf) {
                    Ok(0) => closed = true,
                    Ok(n) => {
                        s.heard.extend_from_slice(&buf[..n]);
                        continue;
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(_) => closed = true, // reset
                }
                break;
            }
            if closed {
                tally.closed += 1;
            } else {
                tally.still_open += 1;
            }
        } else {
            tally.closed += 1; // reset by this side
        }
        judge(s, tally);
    }
    for (kind, tally) in &tallies {
        println!("{}", tally.line(&format!("{kind:?}")));
    }
    println!("FLOOD end opened={}", opened.load(Ordering::Relaxed));
}
