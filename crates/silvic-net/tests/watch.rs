//! A ring you can watch: `TcpCollective::stats` counts collectives, bytes and waits. (The
//! warning a collective that waits long logs is decided by the link's watch, `src/link/watch.rs`,
//! and tested there in virtual time.)

mod common;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::ring_of_threads;
use silvic_net::{Collective, RingStats};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn stats_count_collectives_bytes_and_nothing_for_a_failed_call() {
    let world = 3;
    let n = 30_000; // above the small-path cut: a reduce-scatter then an allgather
    let results = ring_of_threads(world, LIMIT, move |rank, mut ring| {
        assert_eq!(ring.stats(), RingStats::default(), "nothing before the first call");
        let mut buf = vec![rank as f64; n];
        ring.allreduce_sum_f64(&mut buf).unwrap();
        ring.allreduce_max_f64(&mut buf).unwrap();
        let gathered = ring.allgather_bytes(&[rank as u8; 100]).unwrap();
        assert_eq!(gathered.len(), world);
        let before = ring.stats();
        // Another length on one rank: every rank fails, and a failure is not counted.
        let mut odd = vec![0.0; if rank == 1 { 7 } else { 8 }];
        ring.allreduce_sum_f64(&mut odd).unwrap_err();
        (before, ring.stats())
    });
    for (rank, (before, after)) in results.iter().enumerate() {
        assert_eq!(before.collectives, 3, "rank {rank}: {before:?}");
        assert_eq!(after.collectives, 3, "rank {rank}: a failed call counted: {after:?}");
        // An allreduce moves at least 2(n-1)/n of the buffer out of every rank and the same
        // in (the ring's optimum), at most (n-1) whole buffers (the small path).
        let (w, buffer) = (world as u64, n as u64 * 8);
        let least = 2 * (2 * (w - 1) * buffer / w) + (w - 1) * 100;
        let most = 2 * (w - 1) * buffer + (w - 1) * 100 + 64 * 1024; // + headers and notices
        for (what, bytes) in [("sent", before.bytes_sent), ("received", before.bytes_received)] {
            assert!((least..most).contains(&bytes), "rank {rank} {what} {bytes}: {before:?}");
        }
    }
}

/// A wait on a slow rank is counted on the side it waits on. (The warning a long wait logs,
/// and when, is the link's watch's to decide: it is tested there in virtual time, not here by
/// waiting out its ten seconds.)
#[test]
fn a_wait_on_a_slow_rank_is_counted_on_its_side() {
    let calling = Arc::new(Barrier::new(2));
    let results = ring_of_threads(2, LIMIT, move |rank, mut ring| {
        let mut buf = vec![1.0; 1000];
        calling.wait();
        if rank == 1 {
            // The fault under test: a rank that calls a second after the other.
            thread::sleep(Duration::from_secs(1));
            ring.allreduce_sum_f64(&mut buf).unwrap();
            return None;
        }
        let t = Instant::now();
        ring.allreduce_sum_f64(&mut buf).unwrap();
        assert_eq!(buf, vec![2.0; 1000]);
        Some((t.elapsed(), ring.stats()))
    });
    let (took, stats) = results[0].unwrap();
    // Rank 0 took its part to rank 1 at once, then waited on rank 1's part, which comes from
    // its left (in a world of two, rank 1 is both neighbours; the gather's frame comes in on
    // the left stream).
    assert!(stats.waited_left > Duration::ZERO, "{stats:?}");
    assert!(stats.waited_left <= took, "{stats:?} in {took:?}");
    // The right stream is needed only while the frame to it goes out, when the left is too.
    assert!(stats.waited_right <= stats.waited_left, "{stats:?}");
    assert_eq!(stats.collectives, 1);
}

#[test]
fn a_watch_shows_from_another_thread_who_waits_in_which_call_and_who_is_behind() {
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};

    let world = 3;
    let (watches_tx, watches) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let watches_tx = Mutex::new(watches_tx);
    let go_rx = Arc::new(Mutex::new(go_rx));
    let ranks = thread::spawn(move || {
        ring_of_threads(world, LIMIT, move |rank, mut ring| {
            watches_tx.lock().unwrap().send((rank, ring.watch())).unwrap();
            ring.allgather_bytes(&[rank as u8]).unwrap();
            if rank == 1 {
                // The straggler: it reaches the second call only when the test says so.
                go_rx.lock().unwrap().recv_timeout(LIMIT).unwrap();
            }
            let mut buf = vec![1.0; 10];
            ring.allreduce_sum_f64(&mut buf).unwrap();
            assert_eq!(buf, vec![3.0; 10]);
        })
    });
    let mut by_rank: Vec<_> = (0..world).map(|_| watches.recv_timeout(LIMIT).unwrap()).collect();
    by_rank.sort_by_key(|(rank, _)| *rank);
    let watch = |rank: usize| by_rank[rank].1.progress();

    // Ranks 0 and 2 enter the second call and wait there (on rank 1) while this thread reads;
    // rank 1 returns from the first call (perhaps after them) and waits for the test.
    let deadline = Instant::now() + LIMIT;
    let in_second = |r: usize| watch(r).current.is_some_and(|call| call.index == 1);
    while !(in_second(0) && in_second(2)) || watch(1).completed < 1 {
        assert!(Instant::now() < deadline, "the ranks never reached their places");
        thread::sleep(Duration::from_millis(10));
    }
    for rank in [0, 2] {
        let p = watch(rank);
        let call = p.current.unwrap();
        assert_eq!((call.index, call.op), (1, silvic_net::Op::AllreduceSumF64), "{p:?}");
        assert_eq!((p.entered, p.completed, p.failed), (2, 1, false), "rank {rank}: {p:?}");
        assert!(p.last_returned.unwrap() <= call.since, "{p:?}");
    }
    let behind = watch(1);
    assert_eq!((behind.entered, behind.completed, behind.current), (1, 1, None), "{behind:?}");

    go.send(()).unwrap();
    ranks.join().unwrap();
    for rank in 0..world {
        let p = watch(rank);
        assert_eq!((p.entered, p.completed, p.current, p.failed), (2, 2, None, false), "{p:?}");
    }
}
