//! Ranks as separate processes. This test binary starts copies of itself as the ranks: a child
//! finds its role in the environment and runs [`child`] instead of a test. The parent plays the
//! launcher: it reads every child's address, hands the list to all of them, and watches.
//!
//! Every wait is bounded, and children are killed when the parent's guard drops, so a hang is
//! a failure and never a stuck run.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use silvic_net::{Collective, TcpCollective};

const ROLE: &str = "SILVIC_PROC_ROLE";
const ENTRY: &str = "rank_process_entry";

/// The entry point of rank processes, not a test of its own: in a normal run it returns at once.
#[test]
fn rank_process_entry() {
    if let Ok(role) = std::env::var(ROLE) {
        child(&role);
    }
}

fn env_usize(name: &str) -> usize {
    std::env::var(name).unwrap().parse().unwrap()
}

/// A rank: bind, print the address, read everyone's, connect, run the role, report on stdout.
fn child(role: &str) {
    let (rank, world) = (env_usize("SILVIC_PROC_RANK"), env_usize("SILVIC_PROC_WORLD"));
    let timeout = Duration::from_millis(env_usize("SILVIC_PROC_TIMEOUT_MS") as u64);
    let listener = TcpCollective::bind("127.0.0.1").unwrap();
    println!("ADDRESS {}", listener.address());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let addresses: Vec<String> = line.trim().split(',').map(String::from).collect();
    assert_eq!(addresses.len(), world);
    let mut ring = TcpCollective::connect(listener, rank, &addresses, "proc-job", timeout).unwrap();
    println!("READY");
    match role {
        "mixed" => mixed(&mut ring, env_usize("SILVIC_PROC_CALLS")),
        "loop" => big_loop(&mut ring),
        other => panic!("unknown role {other}"),
    }
}

/// A deterministic value for (call, rank, element): every rank can compute every rank's input.
fn hash(call: usize, rank: usize, i: usize) -> u64 {
    let mut x = (call as u64) << 40 ^ (rank as u64) << 20 ^ i as u64;
    x = (x ^ (x >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^ (x >> 29)
}

const LENGTHS: [usize; 11] = [0, 1, 3, 100, 511, 512, 513, 1000, 4099, 70_000, 300_000];

fn mixed(ring: &mut TcpCollective, calls: usize) {
    let (rank, world) = (ring.rank(), ring.world_size());
    for call in 0..calls {
        let len = LENGTHS[(call / 4) % LENGTHS.len()];
        match call % 4 {
            0 => {
                // Integer-valued f64 below 2^53 sum exactly in any order.
                let input = |r: usize, i: usize| (hash(call, r, i) % 1_000_000) as f64;
                let mut buf: Vec<f64> = (0..len).map(|i| input(rank, i)).collect();
                ring.allreduce_sum_f64(&mut buf).unwrap();
                for (i, x) in buf.iter().enumerate() {
                    let expected: f64 = (0..world).map(|r| input(r, i)).sum();
                    assert_eq!(*x, expected, "call {call} sum_f64 element {i}");
                }
            }
            1 => {
                let input = |r: usize, i: usize| hash(call, r, i) as i64;
                let mut buf: Vec<i64> = (0..len).map(|i| input(rank, i)).collect();
                ring.allreduce_sum_i64(&mut buf).unwrap();
                for (i, x) in buf.iter().enumerate() {
                    let expected = (0..world).fold(0i64, |a, r| a.wrapping_add(input(r, i)));
                    assert_eq!(*x, expected, "call {call} sum_i64 element {i}");
                }
            }
            2 => {
                let input = |r: usize, i: usize| hash(call, r, i) as f64 - 9e18;
                let mut buf: Vec<f64> = (0..len).map(|i| input(rank, i)).collect();
                ring.allreduce_max_f64(&mut buf).unwrap();
                for (i, x) in buf.iter().enumerate() {
                    let expected = (0..world).map(|r| input(r, i)).fold(f64::MIN, f64::max);
                    assert_eq!(*x, expected, "call {call} max_f64 element {i}");
                }
            }
            _ => {
                let input = |r: usize| -> Vec<u8> {
                    (0..len % 5000).map(|i| hash(call, r, i) as u8).collect()
                };
                let gathered = ring.allgather_bytes(&input(rank)).unwrap();
                let expected: Vec<Vec<u8>> = (0..world).map(input).collect();
                assert_eq!(gathered, expected, "call {call} allgather");
            }
        }
    }
    println!("OK {calls}");
}

/// 16 MiB allreduces back to back until one fails; reports the error with its peer.
fn big_loop(ring: &mut TcpCollective) {
    let mut buf = vec![1.0f64; 2 << 20];
    for iteration in 0.. {
        if let Err(error) = ring.allreduce_sum_f64(&mut buf) {
            let peer = error.peer().map_or("none".to_string(), |p| p.to_string());
            println!("ERROR {peer} {error:?}");
            return;
        }
        buf.fill(1.0);
        println!("ITER {iteration}");
    }
}

/// The launcher side: children, their stdout lines, and a guard that kills them.
struct Ranks {
    children: Vec<Child>,
    lines: Receiver<(usize, String)>,
}

impl Ranks {
    fn start(world: usize, role: &str, timeout: Duration, extra: &[(&str, String)]) -> Ranks {
        let (tx, lines) = channel();
        let mut children = Vec::new();
        for rank in 0..world {
            let mut command = Command::new(std::env::current_exe().unwrap());
            command
                .args(["--exact", ENTRY, "--nocapture", "--test-threads=1"])
                .env(ROLE, role)
                .env("SILVIC_PROC_RANK", rank.to_string())
                .env("SILVIC_PROC_WORLD", world.to_string())
                .env("SILVIC_PROC_TIMEOUT_MS", timeout.as_millis().to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped());
            for (k, v) in extra {
                command.env(k, v);
            }
            let mut child = command.spawn().unwrap();
            let stdout = child.stdout.take().unwrap();
            let tx = tx.clone();
            thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send((rank, line)).is_err() {
                        break;
                    }
                }
            });
            children.push(child);
        }
        let mut ranks = Ranks { children, lines };
        let mut addresses = vec![String::new(); world];
        for _ in 0..world {
            let (rank, line) = ranks.next_line("ADDRESS ", Duration::from_secs(30));
            addresses[rank] = line;
        }
        let list = addresses.join(",") + "\n";
        for child in &mut ranks.children {
            child.stdin.as_mut().unwrap().write_all(list.as_bytes()).unwrap();
        }
        ranks
    }

    /// What follows `prefix` in the next line that has it, from any rank, within `limit`.
    fn next_line(&mut self, prefix: &str, limit: Duration) -> (usize, String) {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((rank, line)) => {
                    // libtest may print its own words ahead of the child's on the same line.
                    if let Some(at) = line.find(prefix) {
                        return (rank, line[at + prefix.len()..].to_string());
                    }
                }
                Err(_) => panic!("no {prefix:?} line within {limit:?}"),
            }
        }
    }

    fn pid(&self, rank: usize) -> Pid {
        Pid::from_raw(self.children[rank].id() as i32).unwrap()
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = Pid::from_raw(child.id() as i32).map(|p| kill_process(p, Signal::CONT));
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn four_processes_run_hundreds_of_mixed_collectives() {
    let calls = 320;
    let mut ranks = Ranks::start(
        4,
        "mixed",
        Duration::from_secs(60),
        &[("SILVIC_PROC_CALLS", calls.to_string())],
    );
    let mut done = [false; 4];
    for _ in 0..4 {
        let (rank, count) = ranks.next_line("OK ", Duration::from_secs(180));
        assert_eq!(count, calls.to_string());
        done[rank] = true;
    }
    assert_eq!(done, [true; 4]);
    for child in &mut ranks.children {
        assert!(child.wait().unwrap().success());
    }
}

/// Waits until every rank has finished `n` allreduces, so the next ones are in flight.
fn wait_for_iterations(ranks: &mut Ranks, world: usize, n: usize) {
    let mut seen = vec![0; world];
    while seen.iter().any(|&s| s < n) {
        let (rank, _) = ranks.next_line("ITER ", Duration::from_secs(60));
        seen[rank] += 1;
    }
}

/// Collects the ERROR lines of every rank but `gone`, with the time each arrived after `since`.
fn survivor_errors(
    ranks: &mut Ranks,
    world: usize,
    gone: usize,
    since: Instant,
    limit: Duration,
) -> Vec<(usize, String, Duration)> {
    let mut out = Vec::new();
    while out.len() < world - 1 {
        let (rank, rest) = ranks.next_line("ERROR ", limit);
        eprintln!("rank {rank} after {:?}: {rest}", since.elapsed());
        assert_ne!(rank, gone);
        out.push((rank, rest, since.elapsed()));
    }
    out
}

#[test]
fn a_rank_killed_mid_allreduce_fails_every_survivor_within_seconds() {
    let world = 4;
    let mut ranks = Ranks::start(world, "loop", Duration::from_secs(120), &[]);
    wait_for_iterations(&mut ranks, world, 2);
    ranks.children[2].kill().unwrap();
    let killed = Instant::now();
    for (rank, error, after) in
        survivor_errors(&mut ranks, world, 2, killed, Duration::from_secs(20))
    {
        assert!(error.starts_with("2 "), "rank {rank} named another peer: {error}");
        assert!(after < Duration::from_secs(5), "rank {rank} failed after {after:?}: {error}");
    }
}

#[test]
fn a_stopped_rank_fails_every_survivor_after_the_timeout() {
    let world = 4;
    let timeout = Duration::from_secs(3);
    let mut ranks = Ranks::start(world, "loop", timeout, &[]);
    wait_for_iterations(&mut ranks, world, 2);
    kill_process(ranks.pid(1), Signal::STOP).unwrap();
    let stopped = Instant::now();
    let errors = survivor_errors(&mut ranks, world, 1, stopped, Duration::from_secs(30));
    for (rank, error, after) in &errors {
        // Every wait is on a stalled peer: rank 2 waits on rank 1, rank 3 on rank 2, and so on
        // around the ring. A rank further along may time out on its own neighbour a moment
        // before that neighbour times out on rank 1, so the peer it names may be one that was
        // itself waiting; the cause is always a timeout, never a closed or garbled stream.
        assert!(error.contains("Timeout {"), "rank {rank}: {error}");
        // A rank may have been between collectives, or its last bytes still in flight: it
        // fails at one timeout after its last progress, which is never before the stop.
        assert!(
            *after >= timeout - Duration::from_millis(500),
            "rank {rank} at {after:?}: {error}"
        );
        assert!(*after < timeout + Duration::from_secs(3), "rank {rank} at {after:?}: {error}");
    }
}
