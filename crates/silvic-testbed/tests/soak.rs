//! The soak: a world of 4 rank processes on loopback runs 20,000 seeded collectives of mixed
//! kinds and random sizes (0 B to 4 MiB), every result checked on every rank; resident memory
//! and open descriptors must not grow between the end of the warm-up and the end.
//!
//! Needs no privileges. `SILVIC_SOAK_CALLS` changes the count (for a longer run by hand).
//!
//! The same soak with chord streams carrying data: eight hosts (network namespaces, root only,
//! so its name starts `netns_` and nextest's default profile skips it), every connection
//! through the test bed's relay with 1 ms each way, so that connect measures hops long enough
//! for the log-depth paths and the small calls (nine in ten) run their rounds over the chords;
//! sizes up to 256 KiB, so that a call's buffers (a gather holds eight blocks) stay within the
//! growth the memory check allows whenever the largest comes.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use silvic_testbed::net::{Net, require};
use silvic_testbed::rank::parse_peers;
use silvic_testbed::ring::{End, Layout, World};

const WORLD: usize = 4;
const MAX_BYTES: usize = 4 << 20;
const WARMUP: u64 = 2_000;

fn stats(text: &str) -> HashMap<String, u64> {
    text.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

#[test]
fn soak_world_4_processes_20000_mixed_collectives() {
    let calls: u64 =
        std::env::var("SILVIC_SOAK_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let exe = Path::new(env!("CARGO_BIN_EXE_silvic-testbed"));
    let args: Vec<String> = [
        "workload=mixed".to_string(),
        format!("bytes={MAX_BYTES}"),
        format!("count={calls}"),
        "seed=20261129".into(),
        "timeout=120".into(),
        "report=1000".into(),
        format!("warmup={WARMUP}"),
    ]
    .into();
    let started = Instant::now();
    let mut world = World::start(exe, WORLD, None, &Layout::default(), &args, |_| vec![])
        .unwrap_or_else(|e| panic!("start: {e}"));
    // Bounded: far above the few minutes it takes on two busy cores, far below CI's limit.
    check_soak(&mut world, started + Duration::from_secs(1500));
    let elapsed = started.elapsed();
    println!(
        "soak: {calls} collectives x {WORLD} ranks verified in {:.1} s ({:.0} calls/s)",
        elapsed.as_secs_f64(),
        calls as f64 / elapsed.as_secs_f64()
    );
}

/// Every rank of `world` finished every call with correct results by `deadline`, and its open
/// descriptors and resident memory did not grow past the warm-up.
fn check_soak(world: &mut World, deadline: Instant) {
    let ends = world.ends(deadline);
    for (rank, (end, line)) in ends.iter().enumerate() {
        assert_eq!(end, &End::Done, "rank {rank} did not finish cleanly: {line:?}");
    }
    for (rank, child) in world.ranks.iter().enumerate() {
        let find = |prefix: &str| {
            child.seen.iter().find(|l| l.text.starts_with(prefix)).map(|l| stats(&l.text))
        };
        let ready = find("READY").expect("READY line");
        let warm = find("STATS warm").expect("STATS warm line");
        let end = find("STATS end").expect("STATS end line");
        println!(
            "rank {rank}: fds {} -> {} -> {}; rss_kb {} -> {} -> {}; peak rss_kb {} -> {} -> {}",
            ready["fds"],
            warm["fds"],
            end["fds"],
            ready["rss_kb"],
            warm["rss_kb"],
            end["rss_kb"],
            ready["hwm_kb"],
            warm["hwm_kb"],
            end["hwm_kb"]
        );
        assert_eq!(ready["fds"], end["fds"], "rank {rank}: open descriptors changed");
        // The warm-up has met the largest sizes: from then on the peak may not grow by more
        // than noise (allocator fragmentation), never by a buffer.
        assert!(
            end["hwm_kb"] <= warm["hwm_kb"] + 4 * 1024,
            "rank {rank}: peak RSS grew after the warm-up: {} kB -> {} kB",
            warm["hwm_kb"],
            end["hwm_kb"]
        );
        assert!(
            end["rss_kb"] <= warm["rss_kb"] + 4 * 1024,
            "rank {rank}: RSS grew after the warm-up: {} kB -> {} kB",
            warm["rss_kb"],
            end["rss_kb"]
        );
    }
}

#[test]
fn netns_soak_eight_hosts_with_chords_carrying_data() {
    require("netns_soak_chords");
    const HOSTS: usize = 8;
    let calls: u64 = 2_500;
    let exe = Path::new(env!("CARGO_BIN_EXE_silvic-testbed"));
    let args: Vec<String> = [
        "workload=mixed".to_string(),
        format!("bytes={}", 256 << 10),
        format!("count={calls}"),
        "seed=20261201".into(),
        "timeout=120".into(),
        "report=500".into(),
        "warmup=500".into(),
    ]
    .into();
    let started = Instant::now();
    let net = Net::create("soak8", HOSTS).unwrap_or_else(|e| panic!("network: {e}"));
    let layout = Layout { relay: Some((1, 0)) };
    let mut world = World::start(exe, HOSTS, Some(net), &layout, &args, |_| vec![])
        .unwrap_or_else(|e| panic!("start: {e}"));
    // Bounded: a minute or two through the relay on two busy cores.
    check_soak(&mut world, started + Duration::from_secs(600));
    println!(
        "soak with chords: {calls} collectives x {HOSTS} ranks verified in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // The premise: the chords carried data all along, not only control frames.
    for (rank, child) in world.ranks.iter().enumerate() {
        let line = child.seen.iter().find(|l| l.text.starts_with("PEERS end")).expect("PEERS");
        let chords: Vec<_> =
            parse_peers(&line.text).into_iter().filter(|p| p.1.abs() >= 2).collect();
        assert_eq!(chords.len(), 3, "rank {rank}: three chords: {}", line.text);
        println!("rank {rank}: chords (peer, offset, sent, received) {chords:?}");
        for (peer, _, sent, received) in chords {
            assert!(
                sent + received >= 1 << 20,
                "rank {rank}: the chord to rank {peer} carried {} B in {calls} calls",
                sent + received
            );
        }
    }
}
