//! Address and argument validation: `connect` refuses what it cannot use with a typed
//! [`ConnectError::InvalidArgument`] that says what is wrong, at once and before it opens a
//! socket or dials anyone; `bind` refuses hosts it cannot listen on or advertise.
//!
//! "Before any socket is opened" is checked two ways: the process's descriptor count does not
//! grow, and a listener standing in for the right neighbour is never dialled. The tests of this
//! file hold one lock while they count descriptors, so they never see each other's sockets.

mod common;

use std::net::TcpListener;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use silvic_net::{Collective, ConnectError, TcpCollective};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
}

/// A plain listener standing in for a neighbour: it records whether anyone connected.
struct Sentinel(TcpListener);

impl Sentinel {
    fn new() -> Sentinel {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        Sentinel(listener)
    }

    fn address(&self) -> String {
        self.0.local_addr().unwrap().to_string()
    }

    /// Whether a connection arrives within `window`. On loopback a dial completes its TCP
    /// handshake within the `connect(2)` that starts it, long before the window ends; the window
    /// only absorbs the scheduler. It returns as soon as one arrives, and a refused call that
    /// dialled anyway is caught whenever its connection lands inside the window.
    fn dialled_within(&self, window: Duration) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let mut fds = [PollFd::new(&self.0, PollFlags::IN)];
        let timeout = Timespec::try_from(window).expect("a short window");
        poll(&mut fds, Some(&timeout)).expect("poll the sentinel") > 0
    }
}

/// Calls `connect` for `rank` with a fresh listener placed at `addresses[rank]` (where the list
/// says `"SELF"`), and checks that it failed with an invalid argument, fast, having opened and
/// dialled nothing. Returns the error's message.
fn refused(rank: usize, addresses: &[&str], token: &str, timeout: Duration) -> String {
    let sentinel = Sentinel::new();
    let listener = TcpCollective::bind("127.0.0.1").unwrap();
    let mine = listener.address();
    let sentinel_address = sentinel.address();
    let addresses: Vec<String> = addresses
        .iter()
        .map(|a| match *a {
            "SELF" => mine.clone(),
            "SENTINEL" => sentinel_address.clone(),
            other => other.to_string(),
        })
        .collect();
    // connect consumes the listener: on an early refusal the count drops by exactly that one.
    let before = open_fds();
    let started = Instant::now();
    let result = TcpCollective::connect(listener, rank, &addresses, token, timeout);
    let elapsed = started.elapsed();
    let after = open_fds();
    let error = match result {
        Ok(_) => panic!("connect accepted rank {rank} of {addresses:?}"),
        Err(e) => e,
    };
    assert!(matches!(error, ConnectError::InvalidArgument(_)), "{addresses:?}: {error:?}");
    assert_eq!(error.peer(), None, "{error:?}");
    // Refused before any wait: a rendezvous with a sentinel that never answers would take the
    // whole timeout (a minute, or for ever).
    assert!(elapsed < MINUTE, "refusing took {elapsed:?}");
    assert_eq!(after, before - 1, "connect opened or leaked a descriptor: {error}");
    assert!(
        !sentinel.dialled_within(Duration::from_millis(200)),
        "connect dialled a neighbour before refusing: {error}"
    );
    let message = error.to_string();
    assert!(message.starts_with("invalid argument: "), "{message}");
    message
}

const MINUTE: Duration = Duration::from_secs(60);

#[test]
fn addresses_that_are_not_ip_port_are_refused_naming_the_rank_and_the_text() {
    let _serial = serial();
    let bad = [
        "",
        "127.0.0.1",
        "127.0.0.1:",
        ":4000",
        "localhost:4000",
        "127.0.0.1:70000",
        "127.0.0.1:-1",
        "127.0.0.1:40x",
        "256.0.0.1:4000",
        "127.0.0.1:4000:4001",
        " 127.0.0.1:4000",
        "127.0.0.1:4000\n",
        "::1:4000",
        "[::1]",
        "[::1:4000",
        "http://127.0.0.1:4000",
    ];
    for text in bad {
        // Rank 0 is this rank, rank 1 its right neighbour (never dialled), rank 2 is bad.
        let message = refused(0, &["SELF", "SENTINEL", text], "job", MINUTE);
        assert!(message.contains("rank 2"), "{text:?}: {message}");
        assert!(message.contains(&format!("{text:?}")), "{text:?}: {message}");
        assert!(message.contains("ip:port"), "{text:?}: {message}");
    }
}

#[test]
fn addresses_no_one_can_connect_to_are_refused() {
    let _serial = serial();
    for text in ["0.0.0.0:4000", "[::]:4000", "127.0.0.1:0", "[::1]:0"] {
        let message = refused(1, &["SENTINEL", "SELF", text], "job", MINUTE);
        assert!(message.contains("rank 2 cannot be connected to"), "{text}: {message}");
    }
}

#[test]
fn duplicate_addresses_are_refused_naming_both_ranks() {
    let _serial = serial();
    let message =
        refused(0, &["SELF", "SENTINEL", "127.0.0.1:4000", "127.0.0.1:4000"], "job", MINUTE);
    assert!(message.contains("ranks 2 and 3 have the same address 127.0.0.1:4000"), "{message}");
    // The same address written two ways is still the same address.
    let message = refused(0, &["SELF", "SENTINEL", "[::1]:4000", "[0:0::1]:4000"], "job", MINUTE);
    assert!(message.contains("ranks 2 and 3 have the same address [::1]:4000"), "{message}");
    // A rank listed twice, once as itself.
    let message = refused(0, &["SELF", "SENTINEL", "SELF"], "job", MINUTE);
    assert!(message.contains("ranks 0 and 2 have the same address"), "{message}");
}

#[test]
fn a_rank_outside_the_world_is_refused() {
    let _serial = serial();
    for rank in [2, 3, usize::MAX] {
        let message = refused(rank, &["SELF", "SENTINEL"], "job", MINUTE);
        assert!(message.contains(&format!("rank {rank} is out of range for 2")), "{message}");
    }
}

#[test]
fn an_empty_address_list_is_refused() {
    let _serial = serial();
    let message = refused(0, &[], "job", MINUTE);
    assert!(message.contains("address list is empty"), "{message}");
}

#[test]
fn an_empty_token_and_a_zero_timeout_are_refused() {
    let _serial = serial();
    let message = refused(0, &["SELF", "SENTINEL"], "", MINUTE);
    assert!(message.contains("job token is empty"), "{message}");
    let message = refused(0, &["SELF", "SENTINEL"], "job", Duration::ZERO);
    assert!(message.contains("timeout is zero"), "{message}");
    // A world of one opens no sockets, but its arguments are checked all the same.
    let message = refused(0, &["SELF"], "", MINUTE);
    assert!(message.contains("job token is empty"), "{message}");
}

#[test]
fn a_list_that_does_not_give_this_rank_its_own_address_is_refused() {
    let _serial = serial();
    // Rank 1's entry is not its listener, which the list gives to rank 0: two processes were
    // told they are rank 1, or the launcher gathered the list out of order.
    let message = refused(1, &["SELF", "SENTINEL"], "job", MINUTE);
    assert!(message.contains("address of rank 1 is"), "{message}");
    assert!(message.contains("gives this listener's address to rank 0"), "{message}");
    assert!(message.contains("was rank 1 given to two processes"), "{message}");
    assert!(message.contains("rank order"), "{message}");
}

#[test]
fn the_token_never_appears_in_an_argument_error() {
    let _serial = serial();
    let token = "s3cret-job-token";
    for addresses in
        [&["SELF", "nonsense"][..], &["SELF", "SELF"], &["SELF", "SENTINEL", "0.0.0.0:1"]]
    {
        let message = refused(0, addresses, token, MINUTE);
        assert!(!message.contains(token), "{message}");
    }
}

#[test]
fn bind_refuses_hosts_it_cannot_listen_on_or_advertise() {
    let _serial = serial();
    for host in ["0.0.0.0", "::", "[::]"] {
        let error = TcpCollective::bind(host).unwrap_err();
        assert!(matches!(error, ConnectError::InvalidArgument(_)), "{host}: {error:?}");
    }
    for host in ["", "127.0.0.1:4000", "[::1]:4000", "not a host"] {
        let error = TcpCollective::bind(host).unwrap_err();
        assert!(matches!(error, ConnectError::InvalidArgument(_)), "{host:?}: {error:?}");
        assert!(error.to_string().contains(&format!("{host:?}")), "{error}");
    }
    for node_ip in ["", "0.0.0.0", "::", "127.0.0.1:4000", "localhost"] {
        let error = TcpCollective::bind_advertised("127.0.0.1", node_ip).unwrap_err();
        assert!(matches!(error, ConnectError::InvalidArgument(_)), "{node_ip:?}: {error:?}");
    }
    // An address this host does not have: the operating system refuses, and the error says so.
    let error = TcpCollective::bind("192.0.2.1").unwrap_err();
    assert!(matches!(error, ConnectError::Bind { .. }), "{error:?}");
    assert!(error.to_string().contains("192.0.2.1"), "{error}");
    // Brackets around an IPv6 host are accepted.
    assert!(TcpCollective::bind("[::1]").unwrap().address().starts_with("[::1]:"));
}

/// Runs a ring of two threads with `timeout`, bounded by `limit`; returns each rank's allgather.
fn ring_of_two(timeout: Duration, limit: Duration) -> Vec<Vec<Vec<u8>>> {
    common::ring_of_threads_with(2, "127.0.0.1", "job", timeout, limit, move |rank, mut ring| {
        ring.set_timeout(timeout);
        let mut sums = vec![rank as f64; 10_000];
        ring.allreduce_sum_f64(&mut sums).unwrap();
        assert!(sums.iter().all(|&x| x == 1.0), "rank {rank} with {timeout:?}");
        ring.allgather_bytes(&[rank as u8; 3]).unwrap()
    })
}

#[test]
fn the_longest_timeouts_mean_wait_without_end_and_never_overflow() {
    let _serial = serial();
    let expected = vec![vec![0u8; 3], vec![1u8; 3]];
    for timeout in [Duration::MAX, Duration::from_secs(u64::MAX), Duration::from_secs(1 << 40)] {
        assert_eq!(
            ring_of_two(timeout, Duration::from_secs(30)),
            [expected.clone(), expected.clone()]
        );
    }
}
