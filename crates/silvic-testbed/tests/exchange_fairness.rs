//! Fairness at rank 0's address exchange: a real rank joins while strangers flood the exchange,
//! on hosts that are network namespaces (crates/silvic-testbed's `Net`), every rank a process of
//! silvic-net's `from_env` example.
//!
//! Rank 0 serves the exchange on host 0 and rank 1 (host 1) joins it. Then floods of
//! strangers start, each stranger sending a valid Hello (the world's size, a rank of the world)
//! and holding its connection as a half-done handshake ([`Floods`] says which, alone or
//! together):
//!
//! - from rank 1's own address (a co-tenant of its node, pods behind one SNAT address), a few
//!   hundred a second;
//! - from 16 other addresses (host 3), as fast as one thread on one core opens them.
//!
//! Rank 2 starts on host 2 once the floods have filled what rank 0 lets them hold, and reaches
//! the exchange through the test bed's relay, 20 ms each way (a round trip of 40 ms: every one
//! of its handshake's steps waits on the link while the strangers keep arriving).
//!
//! Asserted, in each of [`RUNS`] runs of each flood: rank 2 has the address list within
//! [`JOIN_BOUND`] of its start (by its own clock: from_env logs when the exchange ended), while
//! the floods run, and every rank then forms the ring and sums right. What fairness promises is
//! that a source holding fewer handshakes than any other is never the one dropped for room, so
//! the bound holds however fast the strangers come, as long as rank 0's kernel takes rank 2's
//! connection at all (its accept queue has room). Printed, not asserted: the floods' rates, the
//! time rank 2 took, how many attempts it made (each one rank 0 dropped is retried), and how
//! many lines rank 0 logged meanwhile.
//!
//! Every process and thread is bounded: a rank that has not ended by [`LIMIT`] is killed and
//! fails the test, and the floods stop at their own limit.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use silvic_net::handshake::Connector;
use silvic_testbed::net::{Net, SWITCH_IP, host_ip, relay_ip, require};
use silvic_testbed::relay::{Link, Relay};
use socket2::{Domain, Protocol, Socket, Type};

const TOKEN: &str = "exchange-fairness-test-token-0123456789";
const WORLD: usize = 3;
/// Runs of the whole start for each of [`Floods::ALL`], each with fresh ranks and floods.
const RUNS: usize = 5;
/// How soon after its start rank 2 must have the list.
const JOIN_BOUND: Duration = Duration::from_secs(2);
/// Strangers a second from rank 1's address.
const RANK1_RATE: f64 = 400.0;
/// The other flood's sources: 16 addresses of host 3.
const SOURCES: usize = 16;
/// Connections each flood holds open at once (the oldest is reset for the next): more than rank
/// 0 keeps handshakes for, so it must choose whom to drop.
const HELD: usize = 1024;
/// Which floods run while rank 2 joins.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Floods {
    /// Strangers from rank 1's address alone: an admitted rank's source is capped too.
    Rank1Address,
    /// Strangers from the 16 other addresses alone.
    Others,
    /// Both at once.
    Both,
}

impl Floods {
    const ALL: [Floods; 3] = [Floods::Rank1Address, Floods::Others, Floods::Both];

    fn rank1_address(self) -> bool {
        self != Floods::Others
    }

    fn other_sources(self) -> bool {
        self != Floods::Rank1Address
    }

    /// Strangers the floods open before rank 2 starts: more than rank 0 lets them hold, so its
    /// room is full and turning over (about 1 s of the flood from rank 1's address alone).
    fn head_start(self) -> usize {
        if self.other_sources() { 2000 } else { 400 }
    }
}
/// The link between rank 2 and the exchange, each way.
const DELAY: Duration = Duration::from_millis(20);
/// A run's bound: each rank's own timeout (the example's) is 60 s.
const LIMIT: Duration = Duration::from_secs(80);
/// The floods' own bound, whatever the ranks do.
const FLOOD_LIMIT: Duration = Duration::from_secs(30);

/// silvic-net's `from_env` example, built beside this test by `cargo test` / `cargo nextest`.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps");
    let path = dir.join("examples").join("from_env");
    assert!(path.exists(), "{} is missing: cargo test builds it", path.display());
    path
}

/// Moves this thread into the network namespace `ns` (setns is per thread, and threads it
/// starts inherit it).
fn enter(ns: &str) {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("netns file");
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&file),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .expect("setns");
}

/// A rank process inside `ns`, its stdout and stderr read line by line into `lines`.
struct Rank {
    child: Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    readers: Vec<JoinHandle<()>>,
}

impl Rank {
    fn start(net: &Net, ns: &str, rank: usize, rendezvous: SocketAddr, log: &str) -> Rank {
        let mut command = net.command(ns, "env");
        command.arg("-i");
        for (k, v) in [
            ("SILVIC_RANK", rank.to_string()),
            ("SILVIC_WORLD_SIZE", WORLD.to_string()),
            ("SILVIC_RENDEZVOUS", format!("tcp://{rendezvous}")),
            ("SILVIC_JOB_TOKEN", TOKEN.to_string()),
            ("RUST_LOG", log.to_string()),
        ] {
            command.arg(format!("{k}={v}"));
        }
        command.arg(example());
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("start the from_env example");
        let lines: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        let out = child.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>);
        let err = child.stderr.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>);
        let readers = [out, err]
            .into_iter()
            .flatten()
            .map(|pipe| {
                let lines = lines.clone();
                thread::spawn(move || {
                    for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                        lines.lock().unwrap().push((Instant::now(), line));
                    }
                })
            })
            .collect();
        Rank { child, lines, readers }
    }

    /// The first line containing `text`, waiting until `deadline`.
    fn wait_for(&self, text: &str, deadline: Instant) -> Option<String> {
        loop {
            let found = self.lines.lock().unwrap().iter().find(|(_, l)| l.contains(text)).cloned();
            if let Some((_, line)) = found {
                return Some(line);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the process to end by `deadline`, killing it past that; returns whether it
    /// succeeded and everything it printed.
    fn finish(mut self, deadline: Instant) -> (bool, String) {
        let ok = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status.success();
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break false;
            }
            thread::sleep(Duration::from_millis(10));
        };
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        let text = self.lines.lock().unwrap().iter().map(|(_, l)| format!("{l}\n")).collect();
        (ok, text)
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A flood of strangers from `sources` in the namespace `ns`: each opens a connection, sends a
/// valid Hello and holds it (the oldest reset once [`HELD`] are open), at most `rate` a second
/// (or as fast as this one thread can), until `stop` or [`FLOOD_LIMIT`].
fn flood(
    ns: String,
    sources: Vec<IpAddr>,
    target: SocketAddr,
    rate: Option<f64>,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
) -> JoinHandle<()> {
    thread::spawn(move || {
        enter(&ns);
        let started = Instant::now();
        let mut held = VecDeque::with_capacity(HELD);
        let mut noise = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(target.port());
        for n in 0usize.. {
            if stop.load(Ordering::Relaxed) || started.elapsed() > FLOOD_LIMIT {
                return;
            }
            if let Some(rate) = rate {
                let due = Duration::from_secs_f64(n as f64 / rate);
                if let Some(early) = due.checked_sub(started.elapsed()) {
                    thread::sleep(early);
                }
            }
            let source = SocketAddr::new(sources[n % sources.len()], 0);
            let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
            socket.bind(&source.into()).unwrap();
            // Reset on close: no TIME_WAIT, so the sources' ports never run out.
            socket.set_linger(Some(Duration::ZERO)).unwrap();
            if socket.connect_timeout(&target.into(), Duration::from_millis(200)).is_err() {
                continue;
            }
            noise ^= noise << 13;
            noise ^= noise >> 7;
            noise ^= noise << 17;
            let rank = 1 + (noise % (WORLD as u64 - 1)) as u32;
            let nonce = noise.to_be_bytes().repeat(2).try_into().unwrap();
            let hello = Connector::start(b"no-key", [0; 32], WORLD as u32, rank, 0, nonce).1;
            let _ = (&socket).write_all(&hello.encode());
            opened.fetch_add(1, Ordering::Relaxed);
            if held.len() == HELD {
                held.pop_front();
            }
            held.push_back(socket);
        }
    })
}

/// Parses a `Duration`'s debug text as tracing prints it (`1.5s`, `12.3ms`, `40µs`).
fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => value,
        "ms" => value / 1e3,
        "µs" | "us" => value / 1e6,
        "ns" => value / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

/// What `join` logs (at debug) for each attempt rank 0 did not answer with the list.
const RETRY: &str = "retrying the address exchange";

/// What one run measured.
#[derive(Debug)]
struct Run {
    floods: Floods,
    /// Rank 2's time from its start to the list, by its own clock; `None` if it did not have it
    /// while the floods ran.
    joined: Option<Duration>,
    /// Rank 2's attempts at the exchange until it had the list (or the floods stopped): each
    /// one rank 0 dropped it from is retried, and logged so.
    attempts: usize,
    rank1_rate: f64,
    others_rate: f64,
    rank0_lines: usize,
}

fn run(net: &Net, relay: SocketAddr, port: u16, floods: Floods) -> Run {
    let exchange: SocketAddr = format!("{}:{port}", host_ip(0)).parse().unwrap();
    // Rank 0 logs as a user's would, warnings; and when a rank has sent its address.
    let rank0 =
        Rank::start(net, &net.hosts[0], 0, exchange, "warn,silvic_net::launch::exchange=debug");
    let rank1 = Rank::start(net, &net.hosts[1], 1, exchange, "warn");
    let deadline = Instant::now() + LIMIT;
    let admitted = rank0.wait_for("rank 1 sent its address", deadline);
    assert!(admitted.is_some(), "rank 1 never joined before the flood");

    let stop = Arc::new(AtomicBool::new(false));
    let (from_rank1, from_others) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let rank1_ip: IpAddr = host_ip(1).parse().unwrap();
    let others: Vec<IpAddr> =
        (0..SOURCES).map(|i| format!("10.231.0.{}", 150 + i).parse().unwrap()).collect();
    let mut flooding = Vec::new();
    if floods.rank1_address() {
        let (ns, opened) = (net.hosts[1].clone(), from_rank1.clone());
        let rate = Some(RANK1_RATE);
        flooding.push(flood(ns, vec![rank1_ip], exchange, rate, stop.clone(), opened));
    }
    if floods.other_sources() {
        let (ns, opened) = (net.hosts[3].clone(), from_others.clone());
        flooding.push(flood(ns, others, exchange, None, stop.clone(), opened));
    }
    let head_start = Instant::now() + FLOOD_LIMIT / 2;
    let wanted = floods.head_start();
    while from_rank1.load(Ordering::Relaxed) + from_others.load(Ordering::Relaxed) < wanted {
        assert!(Instant::now() < head_start, "the floods do not reach rank 0");
        thread::sleep(Duration::from_millis(2));
    }
    let rank0_lines_before = rank0.lines.lock().unwrap().len();
    let counts = || (from_rank1.load(Ordering::Relaxed), from_others.load(Ordering::Relaxed));
    let (rank1_before, others_before) = counts();
    let started = Instant::now();
    // Its retries are debug lines (and nothing else of launch/ logs per attempt).
    let rank2 = Rank::start(net, &net.hosts[2], 2, relay, "warn,silvic_net::launch=debug");
    // While the floods run: past the bound by far, so that a rank 2 that gets in late is told
    // apart from one that never gets in.
    let line = rank2.wait_for("addresses exchanged", started + 4 * JOIN_BOUND);
    let flooded_for = started.elapsed();
    let (rank1_after, others_after) = counts();
    let rank0_lines = rank0.lines.lock().unwrap().len() - rank0_lines_before;
    let retries = rank2.lines.lock().unwrap().iter().filter(|(_, l)| l.contains(RETRY)).count();
    stop.store(true, Ordering::Relaxed);
    for f in flooding {
        f.join().expect("a flood");
    }
    let joined = line.and_then(|line| {
        let at = line.find("elapsed=")? + "elapsed=".len();
        parse_duration(line[at..].split_whitespace().next()?)
    });
    for (rank, process) in [rank0, rank1, rank2].into_iter().enumerate() {
        let (ok, out) = process.finish(deadline);
        assert!(ok, "run on port {port}: rank {rank} failed: {out}");
        assert!(out.contains(&format!("rank {rank} of {WORLD}: sum 6 (expected 6)")), "{out}");
    }
    Run {
        floods,
        joined,
        attempts: retries + 1,
        rank1_rate: (rank1_after - rank1_before) as f64 / flooded_for.as_secs_f64(),
        others_rate: (others_after - others_before) as f64 / flooded_for.as_secs_f64(),
        rank0_lines,
    }
}

#[test]
fn netns_a_rank_joins_the_exchange_within_2s_through_floods_from_its_peers_address_and_16_others() {
    require("exchange_fairness");
    let net = Net::create("xfair", 4).unwrap_or_else(|e| panic!("network: {e}"));
    for i in 0..SOURCES {
        let address = format!("10.231.0.{}/24", 150 + i);
        net.ip(&net.hosts[3], &["addr", "add", &address, "dev", "eth0"]).unwrap();
    }
    // Both floods hold their connections in this process.
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    let needed = 8 * HELD as u64;
    if limit.current.is_some_and(|current| current < needed) {
        limit.current = Some(needed);
        limit.maximum = limit.maximum.map(|max| max.max(needed));
        setrlimit(Resource::Nofile, limit).expect("raise the descriptor limit");
    }
    let mut runs = Vec::new();
    let plan = Floods::ALL.into_iter().flat_map(|floods| std::iter::repeat_n(floods, RUNS));
    for (i, floods) in plan.enumerate() {
        let port = 29400 + i as u16;
        let exchange: SocketAddr = format!("{}:{port}", host_ip(0)).parse().unwrap();
        // Rank 2's way to the exchange: the relay on the switch, whose connections to rank 0
        // come from the switch's own address.
        let switch = net.switch.clone();
        let listen: SocketAddr = format!("{}:0", relay_ip(2)).parse().unwrap();
        let relay = thread::scope(|s| {
            s.spawn(|| {
                enter(&switch);
                Relay::start(listen, exchange, Link { delay: DELAY, ..Link::default() })
            })
            .join()
            .unwrap()
            .expect("the relay")
        });
        let measured = run(&net, relay.address(), port, floods);
        eprintln!(
            "exchange fairness run {i} ({floods:?}): rank 2 had the list after {:?} in {} \
             attempt(s) (from {SWITCH_IP}, {DELAY:?} each way); strangers {:.0}/s from rank 1's \
             address and {:.0}/s from {SOURCES} others; rank 0 logged {} lines meanwhile",
            measured.joined,
            measured.attempts,
            measured.rank1_rate,
            measured.others_rate,
            measured.rank0_lines
        );
        runs.push(measured);
        // Its drop wakes its accept loop through the switch's network.
        thread::scope(|s| {
            s.spawn(|| {
                enter(&switch);
                drop(relay);
            });
        });
    }
    for floods in Floods::ALL {
        let of: Vec<&Run> = runs.iter().filter(|r| r.floods == floods).collect();
        let admitted = of.iter().filter(|r| r.joined.is_some()).count();
        let attempts: usize = of.iter().map(|r| r.attempts).sum();
        let slowest = of.iter().filter_map(|r| r.joined).max();
        eprintln!(
            "exchange fairness ({floods:?}): rank 2 admitted in {admitted} of {attempts} \
             attempts over {} runs; slowest join {slowest:?}",
            of.len()
        );
    }
    let late: Vec<(usize, &Run)> =
        runs.iter().enumerate().filter(|(_, r)| r.joined.is_none_or(|t| t > JOIN_BOUND)).collect();
    assert!(late.is_empty(), "rank 2 was late or never joined while the floods ran: {late:?}");
}
