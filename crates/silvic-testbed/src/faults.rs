//! What the namespace fault tests read of a world after a fault: every rank's end and its time
//! to error, printed as `FAULT` rows (docs/failures.md says what each fault does), and the
//! checks every fault shares: survivors fail naming a peer within the fault's bound, no rank
//! ever returns a wrong result, and a failed rank's error sticks.

use std::time::{Duration, Instant};

use crate::MARGIN;
use crate::ring::{End, World};

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
