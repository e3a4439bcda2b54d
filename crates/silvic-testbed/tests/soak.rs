//! The soak: a world of 4 rank processes on loopback runs 20,000 seeded collectives of mixed
//! kinds and random sizes (0 B to 4 MiB), every result checked on every rank; resident memory
//! and open descriptors must not grow between the end of the warm-up and the end.
//!
//! Needs no privileges. `SILVIC_SOAK_CALLS` changes the count (for a longer run by hand).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

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
    let deadline = started + Duration::from_secs(1500);
    let ends = world.ends(deadline);
    let elapsed = started.elapsed();
    for (rank, (end, line)) in ends.iter().enumerate() {
        assert_eq!(end, &End::Done, "rank {rank} did not finish cleanly: {line:?}");
    }
    let mut rows = Vec::new();
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
        // The warm-up has met the largest sizes (about 30 calls of 4 MiB): from then on the
        // peak may not grow by more than noise (allocator fragmentation), never by a buffer.
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
        rows.push(end);
    }
    println!(
        "soak: {calls} collectives x {WORLD} ranks verified in {:.1} s ({:.0} calls/s)",
        elapsed.as_secs_f64(),
        calls as f64 / elapsed.as_secs_f64()
    );
}
