//! Faults on eight hosts (network namespaces on a bridge, one rank process each), where every
//! rank holds chord streams to `r ± 2` and `r + 4` beside its two ring streams: a rank killed,
//! a rank stopped with a short collective timeout, and every packet of one chord (ranks 0 and 4)
//! dropped. Each case asserts that every rank fails, naming the rank at fault, within the bound
//! of the fault, that no rank returns a wrong result and that every error sticks; the times
//! are printed as `FAULT` rows (docs/failures.md says what each fault does).
//!
//! Two layouts. On the bare bridge, connect measures hops far below the 100 us from which the
//! log-depth paths are taken, so the collectives keep to the ring's paths and the chords carry
//! only aborts, waiting notices and liveness. Through the test bed's relay (every connection,
//! chords included, delayed 1 ms each way) the measured hop is over a millisecond, so
//! allreduces of 32 KiB take index-fold-gather or Bruck's gather and allgathers Bruck's,
//! whose rounds send data over every chord: so the calls use the chords by the library's own
//! choice, as a user's would (the test bed does without netem, which the CI VM's kernel lacks),
//! and each relayed case first checks, from the ranks' own
//! per-stream byte counts (`PEERS` lines), that its chords carried data.
//!
//! Needs root, `ip`, `nft` and `tc` (see `netns_faults.rs`); nextest's default profile skips
//! these tests, `--profile ci` runs them. The dropped chord waits out the liveness tier (about
//! a minute); the other cases take seconds.

use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use silvic_net::LIVENESS;
use silvic_testbed::MARGIN;
use silvic_testbed::child::Line;
use silvic_testbed::faults::{assert_survivors_fail, outcomes, words};
use silvic_testbed::net::{Net, host_ip, relay_ip, require};
use silvic_testbed::rank::parse_peers;
use silvic_testbed::ring::{End, Layout, World};

const WORLD: usize = 8;
const VICTIM: usize = 2;
/// Rank 2's streams: its ring neighbours and its chord peers (`2 ± 2`, `2 + 4`).
const VICTIM_PEERS: [usize; 5] = [1, 3, 0, 4, 6];
/// Calls each rank runs before a fault (it prints its per-stream bytes after them).
const WARMUP: u64 = 3;
/// Bytes per call of the relayed cases: an allreduce this small takes a log-depth path on a
/// network of millisecond hops (index-fold-gather or Bruck's gather, both over every chord).
const CALL_BYTES: usize = 32 << 10;
/// Every connection through the relay, 1 ms each way, no jitter.
const RELAYED: Layout = Layout { relay: Some((1, 0)) };

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_silvic-testbed"))
}

/// Starts eight ranks on a fresh network of eight hosts laid out as `layout`, each running
/// `args` with a 10-minute collective timeout unless `args` says otherwise, and waits until
/// every rank has run [`WARMUP`] calls.
fn start(tag: &str, layout: &Layout, args: &[&str]) -> World {
    let net = Net::create(tag, WORLD).unwrap_or_else(|e| panic!("{tag}: network: {e}"));
    let mut all = words(&["count=100000", "gap_ms=5", "timeout=600", "report=1"]);
    all.push(format!("warmup={WARMUP}"));
    all.extend(words(args));
    let mut world = World::start(exe(), WORLD, Some(net), layout, &all, |_| vec![])
        .unwrap_or_else(|e| panic!("{tag}: start: {e}"));
    let ranks: Vec<usize> = (0..WORLD).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    world.wait_oks(&ranks, WARMUP as usize, deadline).unwrap_or_else(|e| panic!("warm-up: {e}"));
    world
}

/// `rank`'s first line starting with `prefix`, read already or before `deadline`.
fn line_of(world: &mut World, rank: usize, prefix: &str, deadline: Instant) -> Line {
    let child = &mut world.ranks[rank];
    if let Some(line) = child.seen.iter().find(|l| l.text.starts_with(prefix)) {
        return line.clone();
    }
    child.wait_for(&[prefix], deadline).unwrap_or_else(|e| panic!("rank {rank}: {e}"))
}

/// The premise of a relayed case: in the warm-up calls, each chord `(a, b)` carried data
/// (at least a call's bytes) in `ways` of its two directions as rank `a` counted them: both
/// ways (2) on the chord of offset `n / 2`, which a log-depth round uses in both directions,
/// else one (a round sends to `r - 2^k` and receives from `r + 2^k`). Aborts, notices and
/// liveness are tens of bytes; the ring's own paths send nothing over a chord.
fn assert_chords_carried_data(world: &mut World, chords: &[(usize, usize)], ways: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for &(a, b) in chords {
        let line = line_of(world, a, "PEERS warm", deadline);
        let peers = parse_peers(&line.text);
        let &(_, offset, sent, received) = peers
            .iter()
            .find(|p| p.0 == b)
            .unwrap_or_else(|| panic!("rank {a} has no stream to rank {b}: {}", line.text));
        println!(
            "FAULT premise | rank {a} to rank {b} (offset {offset}) | sent {sent} B, received \
             {received} B in {WARMUP} calls"
        );
        assert!(offset.unsigned_abs() >= 2, "rank {b} is rank {a}'s ring neighbour, not a chord");
        let carried = [sent, received].iter().filter(|&&n| n >= CALL_BYTES as u64).count();
        assert!(
            carried >= ways,
            "the warm-up calls sent data {carried} ways over the chord {a}-{b}, not {ways}: {}",
            line.text
        );
    }
}

/// The premise of a bare-bridge case: in the warm-up calls, each chord `(a, b)` carried no
/// data, only control frames (under 4 KiB, where a call is a megabyte), as rank `a` counted.
fn assert_chords_idle(world: &mut World, chords: &[(usize, usize)]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for &(a, b) in chords {
        let line = line_of(world, a, "PEERS warm", deadline);
        let peers = parse_peers(&line.text);
        let found = peers.iter().find(|p| p.0 == b);
        let &(_, _, sent, received) =
            found.unwrap_or_else(|| panic!("rank {a} has no stream to rank {b}: {}", line.text));
        assert!(sent < 4096 && received < 4096, "the chord {a}-{b} carried data: {}", line.text);
    }
}

/// Every rank but `except` names `expected` as its peer.
fn assert_all_name(fault: &str, ends: &[(End, Option<Duration>)], except: usize, expected: usize) {
    for (rank, (end, _)) in ends.iter().enumerate().filter(|(r, _)| *r != except) {
        let End::Failed { peer, .. } = end else { panic!("{fault}: rank {rank}: {end:?}") };
        assert_eq!(*peer, Some(expected), "{fault}: rank {rank} named another rank: {end:?}");
    }
}

#[test]
fn netns_sigkill_at_eight_hosts_with_chords_fails_every_survivor_naming_it() {
    // The chords carry no data here (the ring path, forced: on a loaded machine a bare
    // bridge's hop can measure long enough for the choice to take a chord path), but a killed
    // rank's streams close on all of them, and every survivor fails at once, naming it.
    require("netns_sigkill_chords");
    let args = ["kind=sum_f64", "bytes=1048576", "path=ring"];
    let mut world = start("kill8", &Layout::default(), &args);
    let t0 = Instant::now();
    world.ranks[VICTIM].signal(Signal::KILL).unwrap();
    let fault = "sigkill, 8 ranks with chords";
    let ends = outcomes(fault, &mut world, t0, LIVENESS + MARGIN);
    assert_survivors_fail(fault, &ends, &[VICTIM], MARGIN);
    assert_all_name(fault, &ends, VICTIM, VICTIM);
}

#[test]
fn netns_sigkill_while_chords_carry_data_fails_every_survivor_naming_it() {
    // Rank 2 dies in the middle of log-depth rounds: its chord peers (0, 4, 6) lose a stream
    // they read and write data on, its ring neighbours one they carry notices on, and all of
    // them, and the ranks behind them, fail at once naming rank 2.
    require("netns_sigkill_chords_data");
    let args = ["kind=sum_f64", &format!("bytes={CALL_BYTES}")];
    let mut world = start("kill8d", &RELAYED, &args);
    assert_chords_carried_data(&mut world, &[(VICTIM, 0), (VICTIM, 4)], 1);
    assert_chords_carried_data(&mut world, &[(0, 4), (VICTIM, 6)], 2);
    let t0 = Instant::now();
    world.ranks[VICTIM].signal(Signal::KILL).unwrap();
    let fault = "sigkill, chords carrying data";
    let ends = outcomes(fault, &mut world, t0, LIVENESS + MARGIN);
    // A close is heard at once: long before the liveness tier (a minute) could end a call.
    assert_survivors_fail(fault, &ends, &[VICTIM], MARGIN);
    assert_all_name(fault, &ends, VICTIM, VICTIM);
}

/// Every packet between rank 0 and rank 4 (a chord; neither is the other's ring neighbour)
/// dropped while allgathers send data over it (Bruck's third round), every other stream
/// untouched: no close, no reset, only silence. The rank that has data unacknowledged on the
/// chord fails by the liveness tier ([`LIVENESS`], TCP_USER_TIMEOUT) naming its chord peer, and
/// its abort reaches every other rank over the streams that still work, so every rank fails
/// naming rank 0 or rank 4, within the liveness bound (the collective timeout is 10 minutes,
/// so nothing else could end the calls sooner).
#[test]
fn netns_a_chord_whose_packets_are_all_dropped_fails_every_rank_naming_its_ends() {
    require("netns_dropped_chord");
    let args = ["kind=gather", "bytes=16384"];
    let mut world = start("chord04", &RELAYED, &args);
    assert_chords_carried_data(&mut world, &[(0, 4), (4, 0)], 2);
    // Each connection runs host to relay to host; whichever of the two dialled, its host-relay
    // leg is the one on which the relay stands for the other rank, and only there can the
    // switch tell the chord's packets from those of the other streams of hosts 0 and 4.
    let (h0, h4, r0, r4) = (host_ip(0), host_ip(4), relay_ip(0), relay_ip(4));
    let rules = format!(
        "table inet svt {{
           chain chord_in {{ type filter hook input priority 0;
             ip saddr {h0} ip daddr {r4} counter drop
             ip saddr {h4} ip daddr {r0} counter drop
           }}
           chain chord_out {{ type filter hook output priority 0;
             ip saddr {r4} ip daddr {h0} counter drop
             ip saddr {r0} ip daddr {h4} counter drop
           }}
         }}"
    );
    let net = world.net.as_ref().unwrap();
    let t0 = Instant::now();
    net.nft(&net.switch.clone(), &rules).unwrap();
    let fault = "chord 0-4 dropped";
    let ends = outcomes(fault, &mut world, t0, LIVENESS + 2 * MARGIN);
    let net = world.net.as_ref().unwrap();
    let dropped = net.nft_packets(&net.switch);
    println!("FAULT {fault} | packets dropped {dropped}");
    assert!(dropped > 0, "the drop rules never matched");
    let worst = assert_survivors_fail(fault, &ends, &[], LIVENESS + MARGIN);
    for (rank, (end, _)) in ends.iter().enumerate() {
        let End::Failed { peer, .. } = end else { unreachable!("checked above") };
        assert!(
            *peer == Some(0) || *peer == Some(4),
            "{fault}: rank {rank} named neither end of the chord: {end:?}"
        );
    }
    // Silence, not a close: the calls go on until TCP gives up on the dropped chord.
    assert!(worst >= Duration::from_secs(5), "{fault}: failed after {worst:?}");
}

/// Rank 2 SIGSTOPped with a 3 s collective timeout, on the bare bridge with the ring path
/// forced (chords carry no data; left to choose, a loaded machine's bridge can measure a hop
/// long enough for a chord path): rank 2's chord peers do not wait on it, so they must not
/// time out on it, and every rank still names it.
#[test]
fn netns_a_stopped_rank_of_eight_with_chords_is_blamed_by_every_rank() {
    require("netns_stop_blame_chords");
    let args = ["kind=sum_f64", "bytes=1048576", "timeout=3", "path=ring"];
    let mut world = start("blame8", &Layout::default(), &args);
    assert_chords_idle(&mut world, &[(VICTIM, 0), (VICTIM, 4), (VICTIM, 6)]);
    let t0 = Instant::now();
    world.ranks[VICTIM].signal(Signal::STOP).unwrap();
    let fault = "sigstop, timeout 3 s, 8 ranks with chords";
    let ends = stopped_outcomes(fault, &mut world, t0);
    assert_blamed(fault, &world, &ends, &[1, 3]);
}

/// Rank 2 SIGSTOPped with a 3 s collective timeout while the chords carry data: its chord
/// peers (0, 4, 6) now wait on it directly, as its ring neighbours do. Only those five may time
/// out, each naming rank 2 and no sooner than the timeout; every other rank hears one of their
/// aborts, and every error names rank 2.
#[test]
fn netns_a_stopped_rank_is_blamed_by_every_rank_while_chords_carry_data() {
    require("netns_stop_blame_chords_data");
    let args = ["kind=sum_f64", &format!("bytes={CALL_BYTES}"), "timeout=3"];
    let mut world = start("blame8d", &RELAYED, &args);
    assert_chords_carried_data(&mut world, &[(VICTIM, 0), (VICTIM, 4)], 1);
    assert_chords_carried_data(&mut world, &[(VICTIM, 6)], 2);
    let t0 = Instant::now();
    world.ranks[VICTIM].signal(Signal::STOP).unwrap();
    let fault = "sigstop, timeout 3 s, chords carrying data";
    let ends = stopped_outcomes(fault, &mut world, t0);
    assert_blamed(fault, &world, &ends, &VICTIM_PEERS);
}

/// The outcomes of a SIGSTOP of rank 2 at `t0`: once every other rank has ended (or 20 s
/// have passed), rank 2 is resumed, so that it ends too (its streams are closed by then)
/// instead of holding the test until the deadline; what it says is not asserted.
fn stopped_outcomes(fault: &str, world: &mut World, t0: Instant) -> Vec<(End, Option<Duration>)> {
    let limit = Duration::from_secs(20);
    for rank in (0..WORLD).filter(|&r| r != VICTIM) {
        let finals = ["ERR", "DONE", "WRONG", "EXIT"];
        let _ = world.ranks[rank].wait_for(&finals, t0 + limit);
    }
    world.ranks[VICTIM].signal(Signal::CONT).unwrap();
    outcomes(fault, world, t0, limit)
}

/// Every rank but the stopped one failed naming it, the cause its silence; a rank that timed
/// out itself is one of `may_time_out` (ranks that wait on it directly), and its call lasted
/// at least the 3 s timeout.
fn assert_blamed(
    fault: &str,
    world: &World,
    ends: &[(End, Option<Duration>)],
    may_time_out: &[usize],
) {
    let timeout_ms = 3000;
    for (rank, (end, _)) in ends.iter().enumerate().filter(|(r, _)| *r != VICTIM) {
        let End::Failed { peer, message, kind } = end else {
            panic!("{fault}: rank {rank} should have failed, got {end:?}");
        };
        assert_eq!(*peer, Some(VICTIM), "{fault}: rank {rank} blamed another rank: {end:?}");
        assert!(message.contains("no progress from rank 2"), "{fault}: rank {rank}: {end:?}");
        if kind == "timeout" {
            assert!(may_time_out.contains(&rank), "{fault}: rank {rank} timed out itself: {end:?}");
            // "ERR <index> <ms> ...": the call that timed out lasted at least the timeout.
            let err = world.ranks[rank].seen.iter().rev().find(|l| l.text.starts_with("ERR "));
            let ms: u64 = err
                .and_then(|l| l.text.split(' ').nth(2)?.parse().ok())
                .unwrap_or_else(|| panic!("{fault}: rank {rank}: no ERR line"));
            assert!(ms >= timeout_ms, "{fault}: rank {rank} timed out after {ms} ms");
        }
    }
}
