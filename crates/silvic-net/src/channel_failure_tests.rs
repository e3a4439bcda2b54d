//! One failure, one error, every channel: rings of threads on loopback split over four
//! channels, where one stream of one channel breaks mid-call (shut from outside, as a middlebox
//! that resets one flow does). Every rank's call ends, on every channel, long before the
//! collective timeout, with one error naming a rank at an end of the broken stream, and that
//! error sticks. Bounded: the collective timeout is far past [`LIMIT`], so a channel the
//! failure did not end would fail the test by the limit, not by its timeout. And a failed
//! channel ends the rank's other channels while they wait on a peer that no failure of theirs
//! could end (the waker's work: these tests fail by the limit where the waker is not tripped).

use std::net::Shutdown;
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use silvic_core::{Collective, CollectiveError};

use crate::options::{Channels, Settings};
use crate::tcp::TcpCollective;
use crate::topology::Chords;

/// Every ring of these tests is joined within this.
const LIMIT: Duration = Duration::from_secs(60);
/// The collective timeout: far past [`LIMIT`], so that no call may end by it.
const TIMEOUT: Duration = Duration::from_secs(600);
const WORLD: usize = 4;
const CHANNELS: usize = 4;
/// Elements of each call: every channel's share far past a channel's least (1 MiB).
const LEN: usize = 2_000_003;
/// The rank whose stream breaks, and the peer at its other end.
const BROKEN: (usize, usize) = (2, 3);

/// Runs `body` on every rank of a loopback ring of [`WORLD`] ranks forced to [`CHANNELS`]
/// channels, each rank in a thread, all joined within [`LIMIT`].
fn ring_of_channels<R: Send + 'static>(
    body: impl Fn(usize, TcpCollective) -> R + Send + Sync + Clone + 'static,
) -> Vec<R> {
    let listeners: Vec<_> = (0..WORLD).map(|_| TcpCollective::bind("127.0.0.1").unwrap()).collect();
    let addresses: Vec<String> = listeners.iter().map(|l| l.address()).collect();
    let (done, results) = mpsc::channel();
    for (rank, listener) in listeners.into_iter().enumerate() {
        let (body, done, addresses) = (body.clone(), done.clone(), addresses.clone());
        thread::spawn(move || {
            let settings = Settings { channels: Channels::Forced(CHANNELS), ..Settings::default() };
            let ring = TcpCollective::connect_with(
                listener,
                rank,
                &addresses,
                "a-channel-test-token",
                LIMIT,
                Chords::Auto,
                settings,
            );
            let mut ring = ring.unwrap_or_else(|e| panic!("rank {rank} connect: {e}"));
            ring.set_timeout(TIMEOUT);
            let _ = done.send((rank, body(rank, ring)));
        });
    }
    drop(done);
    let deadline = Instant::now() + LIMIT;
    let mut out: Vec<Option<R>> = (0..WORLD).map(|_| None).collect();
    for _ in 0..WORLD {
        let left = deadline.saturating_duration_since(Instant::now());
        let (rank, r) = results.recv_timeout(left).expect("every rank ends within the limit");
        out[rank] = Some(r);
    }
    out.into_iter().map(|r| r.expect("a result per rank")).collect()
}

/// Breaks channel `channel`'s stream from rank 2 to rank 3 once rank 2 is in its second call
/// (the first passes whole), then runs calls until one fails: every rank's first error must
/// name rank 2 or 3 (the ends of the broken stream), and the next call must return it again.
fn one_broken_stream_fails_every_channel(channel: usize) {
    let results = ring_of_channels(move |rank, mut ring| {
        let mut buf: Vec<f64> = (0..LEN).map(|i| (i % 97) as f64 + rank as f64).collect();
        ring.allreduce_sum_f64(&mut buf).expect("the first call, before the break, passes");
        assert_eq!(buf[5], 5.0 * WORLD as f64 + 6.0, "rank {rank}: the first call's sum");
        if rank == BROKEN.0 {
            let stream = match channel {
                0 => ring.ring.as_ref().expect("a ring").stream_to(BROKEN.1),
                c => ring.crew.as_ref().expect("a crew").link(c).stream_to(BROKEN.1),
            };
            let watch = ring.watch();
            thread::spawn(move || {
                // Mid-call: once the second call has begun (bounded by the ring's own limit).
                let deadline = Instant::now() + LIMIT;
                while watch.progress().entered < 2 && Instant::now() < deadline {
                    thread::sleep(Duration::from_millis(1));
                }
                let _ = stream.shutdown(Shutdown::Both);
            });
        }
        let first = (0..3).find_map(|_| ring.allreduce_sum_f64(&mut buf).err());
        let first = first.unwrap_or_else(|| panic!("rank {rank}: no call failed"));
        let again = ring.allreduce_sum_f64(&mut buf[..10]).expect_err("the error sticks");
        (first, again)
    });
    for (rank, (first, again)) in results.into_iter().enumerate() {
        let case = format!("channel {channel}, rank {rank}");
        let named = first.peer();
        assert!(
            named == Some(BROKEN.0) || named == Some(BROKEN.1),
            "{case}: the error names a rank at neither end of the broken stream: {first}"
        );
        assert_ne!(named, Some(rank), "{case}: an error never names its own rank: {first}");
        assert_eq!(again, first, "{case}: the error sticks");
        assert!(!matches!(first, CollectiveError::Timeout { .. }), "{case}: {first}");
    }
}

#[test]
fn a_stream_of_channel_0_that_breaks_mid_call_fails_every_channel_of_every_rank() {
    one_broken_stream_fails_every_channel(0);
}

#[test]
fn a_stream_of_channel_2_that_breaks_mid_call_fails_every_channel_of_every_rank() {
    one_broken_stream_fails_every_channel(2);
}

#[test]
fn a_stream_of_the_last_channel_that_breaks_mid_call_fails_every_channel_of_every_rank() {
    one_broken_stream_fails_every_channel(CHANNELS - 1);
}

/// Breaks channel `channel`'s stream from rank 2 to rank 3 between two calls, and holds rank 3
/// out of the second call until rank 2's has returned: rank 2's other channels wait on rank 3
/// then, so only the waker (the failed channel tripping it) can end them. Rank 2's call must
/// fail naming rank 3, and return while rank 3 is still held out; every other rank fails too.
/// Without the waker rank 2 would wait for rank 3, which waits for rank 2 until [`LIMIT`].
fn a_failed_channel_ends_the_others_while_they_wait(channel: usize) {
    let (first_done, rank3_done) = mpsc::channel::<()>();
    let (second_failed, rank2_failed) = mpsc::channel::<()>();
    let (rank3_done, rank2_failed) =
        (Arc::new(Mutex::new(rank3_done)), Arc::new(Mutex::new(rank2_failed)));
    let results = ring_of_channels(move |rank, mut ring| {
        let mut buf: Vec<f64> = (0..LEN).map(|i| (i % 97) as f64 + rank as f64).collect();
        ring.allreduce_sum_f64(&mut buf).expect("the first call, before the break, passes");
        let mut held_out = true;
        if rank == BROKEN.0 {
            // Rank 3 has all it needs of the first call before its stream breaks.
            let rank3 = rank3_done.lock().unwrap().recv_timeout(LIMIT);
            rank3.expect("rank 3 finishes its first call");
            let stream = match channel {
                0 => ring.ring.as_ref().expect("a ring").stream_to(BROKEN.1),
                c => ring.crew.as_ref().expect("a crew").link(c).stream_to(BROKEN.1),
            };
            stream.shutdown(Shutdown::Both).unwrap();
        } else if rank == BROKEN.1 {
            first_done.send(()).unwrap();
            held_out = rank2_failed.lock().unwrap().recv_timeout(LIMIT).is_ok();
        }
        let error = ring.allreduce_sum_f64(&mut buf).expect_err("the second call fails");
        if rank == BROKEN.0 {
            second_failed.send(()).unwrap();
        }
        (error, held_out)
    });
    for (rank, (error, held_out)) in results.into_iter().enumerate() {
        let case = format!("channel {channel}, rank {rank}");
        assert!(held_out, "{case}: rank 2's call did not end while rank 3 was held out");
        let named = error.peer();
        assert!(named == Some(BROKEN.0) || named == Some(BROKEN.1), "{case}: {error}");
        if rank == BROKEN.0 {
            assert_eq!(named, Some(BROKEN.1), "{case}: rank 2 names its broken stream's peer");
        }
        assert!(!matches!(error, CollectiveError::Timeout { .. }), "{case}: {error}");
    }
}

#[test]
fn a_failed_channel_0_ends_the_other_channels_while_they_wait_on_a_peer() {
    a_failed_channel_ends_the_others_while_they_wait(0);
}

#[test]
fn a_failed_further_channel_ends_channel_0_and_the_others_while_they_wait_on_a_peer() {
    a_failed_channel_ends_the_others_while_they_wait(CHANNELS - 1);
}
