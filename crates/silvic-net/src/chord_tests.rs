//! Rings with chord streams, run as threads on loopback: the link carries ways over chords
//! (several ways taking one stream in turn), and failures travel and are blamed over chords as
//! over the ring. Most drive the link with their own plan ([`Hops`]), whose ways the tests choose;
//! the last runs every allreduce path over it. They force chords at small worlds
//! ([`Chords::Always`]).
//!
//! Every test is bounded: each rank's wait is bounded by its collective timeout, and the ranks
//! are joined within [`LIMIT`] (a hang fails the test).

use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use silvic_core::{Collective, CollectiveError, Op};

use crate::frame::{Dir, Header};
use crate::ring::seam::{Call, FramePlan, Link, Moved, Route};
use crate::tcp::TcpCollective;
use crate::topology::Chords;

#[path = "chord_failure_tests.rs"]
mod failures;

const LIMIT: Duration = Duration::from_secs(60);
const TOKEN: &str = "a-chord-test-token-0123456789";

/// A test plan: on way `w` (to `rank + offsets[w]`) a rank sends `frames` frames of `len` bytes
/// and receives as many from `rank - offsets[w]`, each frame's header and bytes naming the
/// sender, the way and the frame. With `staged`, a way's frames go only once every earlier
/// way's are in (as a log-depth round waits on the one before); else all at once.
struct Hops {
    call: Call,
    ways: Vec<Route>,
    frames: usize,
    len: usize,
    staged: bool,
    /// Labels outgoing frames as those of the way this many later (a plan out of step).
    shift: usize,
    outgoing: Vec<Vec<u8>>,
    /// Per way and frame: its bytes, and how many are in.
    incoming: Vec<Vec<(Vec<u8>, usize)>>,
}

/// The bytes of frame `i` of way `w` from `sender`.
fn bytes_of(sender: usize, w: usize, i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (sender * 31 + w * 7 + i * 3 + j) as u8).collect()
}

impl Hops {
    fn new(call: Call, offsets: &[isize], frames: usize, len: usize, staged: bool) -> Hops {
        let ways: Vec<Route> = offsets.iter().map(|&offset| Route { offset }).collect();
        let outgoing = (0..ways.len() * frames)
            .map(|k| bytes_of(call.rank, k / frames, k % frames, len))
            .collect();
        let incoming = ways.iter().map(|_| vec![(vec![0; len], 0); frames]).collect();
        Hops { call, ways, frames, len, staged, shift: 0, outgoing, incoming }
    }

    fn head(&self, w: usize, i: usize, sender: usize) -> Header {
        let Call { op, seq, world, .. } = self.call;
        let block = (w * self.frames + i) * world + sender;
        Header::data(op, seq, self.len as u64, self.len as u64).carrying(Dir::Right, block)
    }

    /// Whether every frame came in whole and as its sender sent it.
    fn check(&self) -> Result<(), String> {
        let Call { rank, world, .. } = self.call;
        for (w, route) in self.ways.iter().enumerate() {
            let from = route.receives_from(rank, world);
            for (i, (got, filled)) in self.incoming[w].iter().enumerate() {
                if *filled != self.len || *got != bytes_of(from, w, i, self.len) {
                    return Err(format!("rank {rank} way {w} frame {i} from {from}"));
                }
            }
        }
        Ok(())
    }
}

impl FramePlan for Hops {
    fn call(&self) -> Call {
        self.call
    }
    fn ways(&self) -> &[Route] {
        &self.ways
    }
    fn frames(&self, _: usize) -> usize {
        self.frames
    }
    fn header(&self, way: usize, i: usize) -> Header {
        self.head(way + self.shift, i, self.call.rank)
    }
    fn expect(&self, way: usize, j: usize) -> Header {
        let from = self.ways[way].receives_from(self.call.rank, self.call.world);
        self.head(way, j, from)
    }
    fn ready(&self, way: usize, progress: Moved<'_>) -> bool {
        !self.staged || progress.received[..way].iter().all(|&n| n == self.frames)
    }
    fn may_receive(&self, _: usize, _: Moved<'_>) -> bool {
        true
    }
    fn payload(&self, way: usize, i: usize) -> &[u8] {
        &self.outgoing[way * self.frames + i]
    }
    fn space(&mut self, way: usize, j: usize) -> &mut [u8] {
        let (got, filled) = &mut self.incoming[way][j];
        &mut got[*filled..]
    }
    fn commit(&mut self, way: usize, j: usize, n: usize) {
        self.incoming[way][j].1 += n;
    }
}

/// Runs a ring of `world` ranks as threads on 127.0.0.1, connected with `chords` and the
/// collective `timeout`, each running `body`; the results in rank order, within [`LIMIT`].
fn chord_ring<R: Send + 'static>(
    world: usize,
    chords: Chords,
    timeout: Duration,
    body: impl Fn(usize, TcpCollective) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let listeners: Vec<_> = (0..world).map(|_| TcpCollective::bind("127.0.0.1").unwrap()).collect();
    let addresses: Vec<String> = listeners.iter().map(|l| l.address()).collect();
    let body = Arc::new(body);
    let (done, results) = mpsc::channel();
    for (rank, listener) in listeners.into_iter().enumerate() {
        let (body, done, addresses) = (body.clone(), done.clone(), addresses.clone());
        thread::spawn(move || {
            let ring = TcpCollective::connect_with(
                listener,
                rank,
                &addresses,
                TOKEN,
                LIMIT,
                chords,
                crate::options::Settings::default(),
            )
            .unwrap_or_else(|e| panic!("rank {rank} connect: {e}"));
            let mut ring = ring;
            ring.set_timeout(timeout);
            let _ = done.send((rank, body(rank, ring)));
        });
    }
    drop(done);
    let deadline = Instant::now() + LIMIT;
    let mut out: Vec<Option<R>> = (0..world).map(|_| None).collect();
    for _ in 0..world {
        let left = deadline.saturating_duration_since(Instant::now());
        let (rank, r) = results.recv_timeout(left).expect("every rank finishes within the limit");
        out[rank] = Some(r);
    }
    out.into_iter().map(|r| r.expect("a result per rank")).collect()
}

/// Every offset `± 2^k` (`2^k < world`) once, then the first two again: ways that share
/// streams, both with other ways of the same offset and (at four ranks) with the opposite one.
fn offsets(world: usize) -> Vec<isize> {
    let mut offsets: Vec<isize> = (0..usize::BITS)
        .map(|k| 1isize << k)
        .take_while(|&d| (d as usize) < world)
        .flat_map(|d| [d, -d])
        .collect();
    offsets.extend([offsets[0], offsets[2 % offsets.len()]]);
    offsets
}

/// Runs one [`Hops`] plan on `ring` as a collective.
fn hops(
    ring: &mut TcpCollective,
    offsets: &[isize],
    (frames, len, staged): (usize, usize, bool),
    shift: usize,
) -> Result<Hops, CollectiveError> {
    let (rank, world) = (ring.rank, ring.world);
    ring.run(Op::AllgatherBytes, len, |link, seq, _| {
        let call = Call { rank, world, op: Op::AllgatherBytes, seq };
        let mut plan = Hops::new(call, offsets, frames, len, staged);
        plan.shift = shift;
        link.run(&mut plan)?;
        Ok(plan)
    })
}

#[test]
fn ways_over_chords_carry_every_frame_to_its_peer_in_turn() {
    for world in [2, 3, 4, 5, 8] {
        for shape in [(3, 100, false), (2, 300_000, true), (2, 300_000, false)] {
            let offsets = offsets(world);
            let results = chord_ring(world, Chords::Always, LIMIT, move |_, mut ring| {
                let plan = hops(&mut ring, &offsets, shape, 0).map_err(|e| e.to_string())?;
                plan.check()?;
                Ok::<_, String>((ring.stats(), ring.peer_stats()))
            });
            for (rank, result) in results.into_iter().enumerate() {
                let (stats, peers) = result.unwrap_or_else(|e| panic!("{world} {shape:?}: {e}"));
                let streams = crate::topology::topology(rank, world, Chords::Always);
                assert_eq!(peers.len(), streams.streams().count());
                assert!(peers.iter().all(|p| p.bytes_sent > 0 && p.bytes_received > 0));
                let sent: u64 = peers.iter().map(|p| p.bytes_sent).sum();
                assert_eq!(sent, stats.bytes_sent, "world {world} rank {rank}");
            }
        }
    }
}

/// What the child of the small-buffers test is told by, and its name for the test harness.
const SMALL_BUFFERS_CHILD: (&str, &str) =
    ("SILVIC_CHORD_SMALL_BUFFERS", "tcp::chord_tests::small_buffers_chord_ring");

/// No deadlock over chords however small the socket buffers: as `tests/small_buffers.rs` does
/// for the ring, the ranks run in a network namespace of their own (`unshare --user --net`, no
/// privilege needed) whose TCP buffers are 4 KiB, minimum, default and maximum, so every frame
/// of 256 KiB on every stream, chords and shared ones included, waits on its reader many times.
/// The child is this test binary again, running [`small_buffers_chord_ring`].
#[test]
fn ways_over_chords_never_deadlock_on_small_socket_buffers() {
    let script = "for t in tcp_wmem tcp_rmem; do echo '4096 4096 4096' > /proc/sys/net/ipv4/$t \
                  || exit 1; done && ip link set lo up && exec \"$@\"";
    let path = format!("{}:/usr/sbin:/sbin", std::env::var("PATH").unwrap_or_default());
    let mut child = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "--", "sh", "-c", script, "sh"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", SMALL_BUFFERS_CHILD.1, "--ignored", "--test-threads=1"])
        .env("PATH", path)
        .env(SMALL_BUFFERS_CHILD.0, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("unshare (util-linux) runs");
    // Bounded: a deadlock would never end.
    let deadline = Instant::now() + 2 * LIMIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "the ranks in the small-buffers namespace did not finish within {:?}",
                2 * LIMIT
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}: {text}{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("1 passed"), "the child ran no test: {text}");
}

/// Runs inside the small-buffers namespace: checks that its sockets are small, then moves
/// [`Hops`] plans over chords at worlds 4 and 8, all at once and round by round, and runs the
/// log-depth paths themselves (Bruck's gather and fold, index-fold-gather) on a megabyte at
/// world 8, every rank's bits the oracle's.
#[test]
#[ignore = "runs inside the network namespace of the chords' small-buffers test, which starts it"]
fn small_buffers_chord_ring() {
    assert!(std::env::var_os(SMALL_BUFFERS_CHILD.0).is_some(), "started by its parent test");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let sock = socket2::SockRef::from(&client);
    let buffers = (sock.send_buffer_size().unwrap(), sock.recv_buffer_size().unwrap());
    assert!(buffers.0 <= 16 * 1024 && buffers.1 <= 16 * 1024, "not small: {buffers:?}");
    drop((client, listener));
    for world in [4, 8] {
        for staged in [false, true] {
            let offsets = offsets(world);
            let results = chord_ring(world, Chords::Always, LIMIT, move |_, mut ring| {
                let plan = hops(&mut ring, &offsets, (2, 256 * 1024, staged), 0);
                plan.map_err(|e| e.to_string())?.check()
            });
            for (rank, result) in results.into_iter().enumerate() {
                result.unwrap_or_else(|e| panic!("world {world} staged {staged} rank {rank}: {e}"));
            }
        }
    }
    use crate::ring::choice::Path;
    use crate::ring::oracle::{bits, input, reference};
    let (world, len) = (8, (1 << 17) + 7);
    let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
    let expected = bits(&reference(&inputs, silvic_core::fold::sum_f64));
    let inputs = Arc::new(inputs);
    let results = chord_ring(world, Chords::Auto, LIMIT, move |rank, mut ring| {
        sums_on(&mut ring, &inputs[rank], &[Path::Bruck, Path::Index])
    });
    for (rank, got) in results.iter().enumerate() {
        for (path, bits) in got {
            assert_eq!(*bits, expected, "small buffers, world {world}, rank {rank}, {path:?}");
        }
    }
}

#[test]
fn every_allreduce_path_over_tcp_with_chords_gives_the_same_bits() {
    use crate::ring::choice::Path;
    use crate::ring::oracle::{bits, input, reference};
    // Each path forced, over real sockets, at worlds a power of two and not (chords forced at
    // the small ones): every rank's bits equal the fold-order oracle's.
    for world in [4, 5, 8, 9] {
        for len in [1, 9, 4096, 70_000] {
            let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
            let expected = bits(&reference(&inputs, silvic_core::fold::sum_f64));
            let inputs = Arc::new(inputs);
            let results = chord_ring(world, Chords::Always, LIMIT, move |rank, mut ring| {
                sums_on(
                    &mut ring,
                    &inputs[rank],
                    &[Path::Ring, Path::Gather, Path::Bruck, Path::Index],
                )
            });
            for (rank, got) in results.iter().enumerate() {
                for (path, bits) in got {
                    assert_eq!(*bits, expected, "world {world} len {len} rank {rank} {path:?}");
                }
            }
        }
    }
}

/// Sums `input` over the ring once on each of `paths`, forced: the bits each call gave.
fn sums_on(
    ring: &mut TcpCollective,
    input: &[f64],
    paths: &[crate::ring::choice::Path],
) -> Vec<(crate::ring::choice::Path, Vec<u64>)> {
    let (rank, world) = (ring.rank, ring.world);
    paths
        .iter()
        .map(|&path| {
            let mut buf = input.to_vec();
            ring.run(Op::AllreduceSumF64, input.len() * 8, |link, seq, scratch| {
                let call = Call { rank, world, op: Op::AllreduceSumF64, seq };
                let sum = silvic_core::fold::sum_f64;
                crate::ring::allreduce_on(path, link, call, &mut buf, sum, scratch)
            })
            .unwrap_or_else(|e| panic!("rank {rank} {path:?}: {e}"));
            (path, crate::ring::oracle::bits(&buf))
        })
        .collect()
}
