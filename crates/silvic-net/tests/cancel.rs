//! A `Cancel` tripped from another thread ends the call it watches within about 100 ms: a
//! `connect` waiting on a rank that never starts, a `from_env` rank waiting on a rank 0 that
//! never starts, and a collective waiting on a peer that never calls, whose error then sticks
//! and reaches the peer as an abort naming this rank (on every channel of a call split over
//! several). Every wait here is bounded by a timeout far longer than the test lets it run, so a
//! cancel that is not seen fails the test.

mod common;

use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use silvic_net::{
    Cancel, Collective, CollectiveError, ConnectError, ConnectOptions, TcpCollective,
};

const TOKEN: &str = "cancel-test-token-0123456789abcdef";
/// The calls' own timeout: a cancel that is missed shows as a call that runs this long.
const LONG: Duration = Duration::from_secs(60);
/// How soon after the cancel the call must have returned (the cancel's cadence is 100 ms).
const SOON: Duration = Duration::from_secs(2);

/// Trips `cancel` after `after`, from another thread; returns when it did.
fn trip_after(cancel: &Cancel, after: Duration) -> thread::JoinHandle<Instant> {
    let cancel = cancel.clone();
    thread::spawn(move || {
        thread::sleep(after);
        cancel.cancel();
        Instant::now()
    })
}

fn dead_address() -> String {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string()
}

#[test]
fn a_cancel_ends_a_connect_waiting_on_a_rank_that_never_starts() {
    let listener = TcpCollective::bind("127.0.0.1").unwrap();
    let addresses = vec![listener.address(), dead_address()];
    let cancel = Cancel::new();
    let tripped = trip_after(&cancel, Duration::from_millis(300));
    let outcome = cancel.during(|| TcpCollective::connect(listener, 0, &addresses, TOKEN, LONG));
    let returned = Instant::now();
    let tripped = tripped.join().unwrap();
    assert!(matches!(outcome, Err(ConnectError::Cancelled)), "{:?}", outcome.map(drop));
    assert!(returned.duration_since(tripped) < SOON, "{:?}", returned.duration_since(tripped));
}

#[test]
fn a_cancel_ends_a_from_env_rank_waiting_on_rank_0() {
    let rendezvous = format!("tcp://{}", dead_address());
    let vars = move |name: &str| match name {
        "SILVIC_RANK" => Some("1".to_string()),
        "SILVIC_WORLD_SIZE" => Some("2".to_string()),
        "SILVIC_RENDEZVOUS" => Some(rendezvous.clone()),
        "SILVIC_JOB_TOKEN" => Some(TOKEN.to_string()),
        _ => None,
    };
    let cancel = Cancel::new();
    let tripped = trip_after(&cancel, Duration::from_millis(300));
    let outcome = cancel.during(|| TcpCollective::from_vars(vars, LONG));
    let returned = Instant::now();
    let tripped = tripped.join().unwrap();
    assert!(matches!(outcome, Err(ConnectError::Cancelled)), "{:?}", outcome.map(drop));
    assert!(returned.duration_since(tripped) < SOON, "{:?}", returned.duration_since(tripped));
}

#[test]
fn a_cancelled_collective_sticks_and_its_peer_hears_an_abort_naming_this_rank() {
    let (mut listeners, addresses) = common::listeners(2);
    let rank1 = listeners.pop().unwrap();
    let rank0 = listeners.pop().unwrap();
    let peer_addresses = addresses.clone();
    let peer = thread::spawn(move || {
        let mut ring = TcpCollective::connect(rank1, 1, &peer_addresses, TOKEN, LONG).unwrap();
        // Never calls until rank 0 has given up; then its call hears why.
        thread::sleep(Duration::from_millis(1500));
        ring.allreduce_sum_f64(&mut [2.0; 1000])
    });
    let mut ring = TcpCollective::connect(rank0, 0, &addresses, TOKEN, LONG).unwrap();
    ring.set_timeout(LONG);
    let cancel = Cancel::new();
    let tripped = trip_after(&cancel, Duration::from_millis(300));
    let outcome = cancel.during(|| ring.allreduce_sum_f64(&mut [1.0; 1000]));
    let returned = Instant::now();
    let tripped = tripped.join().unwrap();
    assert_eq!(outcome, Err(CollectiveError::Cancelled));
    assert!(returned.duration_since(tripped) < SOON, "{:?}", returned.duration_since(tripped));
    // Sticky, as any failure: the next call fails the same way at once, cancel or not.
    assert_eq!(ring.allgather_bytes(b"x").map(drop), Err(CollectiveError::Cancelled));
    let heard = peer.join().unwrap().unwrap_err();
    assert_eq!(
        heard,
        CollectiveError::Aborted { origin: 0, cause: Box::new(CollectiveError::Cancelled) },
        "{heard}"
    );
    assert_eq!(heard.peer(), Some(0));
}

#[test]
fn a_cancel_ends_a_call_split_over_two_channels_and_every_channel_of_the_peer_hears_it() {
    // 2.4 MB of f64: more than two of a channel's least shares, so the call splits.
    const LEN: usize = 300_007;
    let options = ConnectOptions::new().channels(2);
    let (mut listeners, addresses) = common::listeners(2);
    let rank1 = listeners.pop().unwrap();
    let rank0 = listeners.pop().unwrap();
    let (peer_addresses, peer_options) = (addresses.clone(), options.clone());
    let peer = thread::spawn(move || {
        let mut ring = TcpCollective::connect_with_options(
            rank1,
            1,
            &peer_addresses,
            TOKEN,
            LONG,
            &peer_options,
        )
        .unwrap();
        // Never calls until rank 0 has given up; then its call hears why, on every channel.
        thread::sleep(Duration::from_millis(1500));
        ring.allreduce_sum_f64(&mut vec![2.0; LEN])
    });
    let mut ring =
        TcpCollective::connect_with_options(rank0, 0, &addresses, TOKEN, LONG, &options).unwrap();
    ring.set_timeout(LONG);
    let cancel = Cancel::new();
    let tripped = trip_after(&cancel, Duration::from_millis(300));
    let outcome = cancel.during(|| ring.allreduce_sum_f64(&mut vec![1.0; LEN]));
    let returned = Instant::now();
    let tripped = tripped.join().unwrap();
    assert_eq!(outcome, Err(CollectiveError::Cancelled));
    assert!(returned.duration_since(tripped) < SOON, "{:?}", returned.duration_since(tripped));
    let channels = ring.channel_stats();
    assert_eq!(channels.len(), 2);
    assert!(channels[1].bytes_sent > 0, "the call split: channel 1 sent its first piece");
    assert_eq!(ring.allreduce_sum_f64(&mut vec![1.0; LEN]), Err(CollectiveError::Cancelled));
    let heard = peer.join().unwrap().unwrap_err();
    assert_eq!(
        heard,
        CollectiveError::Aborted { origin: 0, cause: Box::new(CollectiveError::Cancelled) },
        "{heard}"
    );
}
