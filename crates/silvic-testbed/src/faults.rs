//! What the namespace fault tests read of a world after a fault: every rank's end and its time
//! to error, printed as `FAULT` rows (docs/failures.md says what each fault does), and the
//! checks every fault shares: survivors fail naming a peer within the fault's bound, no rank
//! ever returns a wrong result, and a failed rank's error sticks; and the one case where nobody
//! may fail, a rank paused past the liveness bound ([`paused_rank_is_waited_for`]).

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::Signal;

use crate::MARGIN;
use crate::net::Net;
use crate::ring::{End, Layout, World};

/// Owned words of `list`, as rank arguments.
pub fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// An nft table that applies `statements` to what the switch forwards between hosts.
pub fn forward_filter(statements: &str) -> String {
    format!(
        "table inet svt {{ chain forward_filter {{ type filter hook forward priority 0;
           {statements}
         }}
         }}"
    )
}

/// Every rank's end and its time after `t0`, waiting until `t0 + limit`; prints the table rows
/// ("FAULT | rank | outcome | seconds"). A failed rank calls once more, and its error must
/// stick (the same value), or this panics.
pub fn outcomes(
    fault: &str,
    world: &mut World,
    t0: Instant,
    limit: Duration,
) -> Vec<(End, Option<Duration>)> {
    let ends = world.ends(t0 + limit);
    let ends = ends
        .into_iter()
        .enumerate()
        .map(|(rank, (end, line))| {
            let after = line.map(|l| l.at.saturating_duration_since(t0));
            let shown = match &end {
                End::Failed { peer, kind, message } => format!("peer={peer:?} {kind}: {message}"),
                other => format!("{other:?}"),
            };
            let secs = after.map_or("-".into(), |d| format!("{:.2}", d.as_secs_f64()));
            println!("FAULT {fault} | rank {rank} | {shown} | {secs}");
            (end, after)
        })
        .collect::<Vec<_>>();
    for (rank, (end, _)) in ends.iter().enumerate() {
        if let End::Failed { .. } = end {
            let child = &mut world.ranks[rank];
            let sticky = child.wait_for(&["STICKY"], Instant::now() + MARGIN).unwrap();
            assert_eq!(sticky.text, "STICKY same", "{fault}: rank {rank}'s error did not stick");
        }
    }
    ends
}

/// Checks that every rank but `except` failed naming a peer within `bound` of the fault, and
/// that no rank returned a wrong result; returns the worst time to error.
pub fn assert_survivors_fail(
    fault: &str,
    ends: &[(End, Option<Duration>)],
    except: &[usize],
    bound: Duration,
) -> Duration {
    let mut worst = Duration::ZERO;
    for (rank, (end, after)) in ends.iter().enumerate() {
        assert!(
            !matches!(end, End::Wrong(_)),
            "{fault}: rank {rank} returned a wrong result: {end:?}"
        );
        if except.contains(&rank) {
            continue;
        }
        let End::Failed { peer, .. } = end else {
            panic!("{fault}: rank {rank} should have failed, got {end:?}");
        };
        assert!(peer.is_some(), "{fault}: rank {rank}'s error names no peer: {end:?}");
        let after = after.expect("a failure has a time");
        assert!(after <= bound, "{fault}: rank {rank} took {after:?} to fail (bound {bound:?})");
        worst = worst.max(after);
    }
    println!("FAULT {fault} | worst time to error {:.2} s", worst.as_secs_f64());
    worst
}

/// How long [`paused_rank_is_waited_for`] stops its rank: longer than the liveness bound (60 s)
/// by more than its margin, shorter than the collective timeout.
pub const PAUSE: Duration = Duration::from_secs(100);

/// While `victim` is stopped, until `until`: no other rank reports a failed or wrong call
/// (`ERR`, `WRONG`); a rank that gives up on a paused peer fails the test, naming it.
pub fn assert_none_fails_before(tag: &str, world: &mut World, victim: usize, until: Instant) {
    for (rank, child) in world.ranks.iter_mut().enumerate() {
        if rank == victim {
            continue;
        }
        while let Some(line) = child.next_line(until) {
            assert!(
                !line.text.starts_with("ERR"),
                "{tag}: rank {rank} failed in the pause: {}",
                line.text
            );
            assert!(!line.text.starts_with("WRONG"), "{tag}: rank {rank}: {}", line.text);
        }
    }
}

/// Rank `victim` of `world` hosts stopped (SIGSTOP) for [`PAUSE`] in the middle of 16 MiB
/// allreduces (`extra` adds rank arguments, such as `channels=4`), the collective timeout 300 s:
/// nobody may fail or return a wrong result meanwhile, and after SIGCONT every rank finishes
/// every call with correct results. Every host's TCP socket buffers are capped at 16 KiB (Linux
/// allows 6 MiB by default), so that a ring frame (a slice of up to 256 KiB) cannot vanish into
/// them: the stopped rank's windows close, as they do for the far larger frames of a real job on
/// a fast network. `premise(world, stopped_at)` runs right after the stop, to check that the
/// pause does what the test means it to. Rows print as "FAULT {tag} ..."; returns the time from
/// the stop to the end; panics on any failure.
pub fn paused_rank_is_waited_for(
    exe: &Path,
    tag: &str,
    (world, victim): (usize, usize),
    extra: &[&str],
    premise: impl FnOnce(&World, Instant),
) -> Duration {
    let mut args = words(&["kind=sum_f64", "bytes=16777216", "count=12", "timeout=300"]);
    args.extend(words(extra));
    let net = Net::create("stop", world).unwrap_or_else(|e| panic!("{tag}: network: {e}"));
    for ns in &net.hosts {
        for buffer in ["net.ipv4.tcp_rmem=4096 16384 16384", "net.ipv4.tcp_wmem=4096 16384 16384"] {
            net.exec(ns, "sysctl", &["-qw", buffer]).unwrap();
        }
    }
    let mut world = World::start(exe, world, Some(net), &Layout::default(), &args, |_| vec![])
        .unwrap_or_else(|e| panic!("{tag}: start: {e}"));
    let deadline = Instant::now() + Duration::from_secs(180);
    world.wait_oks(&[victim], 3, deadline).unwrap_or_else(|e| panic!("{tag}: warm-up: {e}"));
    world.ranks[victim].signal(Signal::STOP).unwrap();
    let t0 = Instant::now();
    premise(&world, t0);
    assert_none_fails_before(tag, &mut world, victim, t0 + PAUSE);
    thread::sleep((t0 + PAUSE).saturating_duration_since(Instant::now()));
    world.ranks[victim].signal(Signal::CONT).unwrap();
    let ends = outcomes(tag, &mut world, Instant::now(), Duration::from_secs(240));
    for (rank, (end, _)) in ends.iter().enumerate() {
        assert_eq!(end, &End::Done, "{tag}: rank {rank} did not finish every call");
    }
    t0.elapsed()
}
