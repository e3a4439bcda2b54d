//! Failures with ranks as threads: every error kind names the right peer, failures travel
//! around the ring, errors stick, and mistakes in setup fail fast with the reason.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{CONNECT_TIMEOUT, MARGIN, connect_each, ring_of, ring_of_threads};
use silvic_net::{Collective, CollectiveError, ConnectError, RejectReason, TcpCollective};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn a_rank_that_drops_its_ring_fails_its_neighbours_naming_it() {
    let results = ring_of_threads(3, LIMIT, |rank, mut ring| {
        let mut buf = vec![1.0; 10_000];
        ring.allreduce_sum_f64(&mut buf).unwrap();
        if rank == 1 {
            drop(ring);
            return None;
        }
        let first = ring.allreduce_sum_f64(&mut buf).unwrap_err();
        let second = ring.allgather_bytes(b"later").unwrap_err();
        Some((first, second))
    });
    for rank in [0, 2] {
        let (first, second) = results[rank].clone().unwrap();
        assert_eq!(first.peer(), Some(1), "rank {rank}: {first}");
        assert_eq!(first, second, "rank {rank}: the error must stick");
    }
}

#[test]
fn ranks_calling_different_ops_fail_out_of_step() {
    let results = ring_of_threads(3, LIMIT, |rank, mut ring| {
        let mut buf = vec![1.0; 100];
        let error = if rank == 0 {
            ring.allreduce_sum_f64(&mut buf).unwrap_err()
        } else {
            ring.allreduce_max_f64(&mut buf).unwrap_err()
        };
        (error, ring.allreduce_max_f64(&mut buf).unwrap_err())
    });
    // The small path's gather runs both ways: rank 1 reads rank 0's frame (and rank 2 reads
    // it too), and rank 0 reads those of ranks 1 and 2, whichever comes first: all see the
    // other op.
    assert!(matches!(
        results[1].0,
        CollectiveError::OutOfStep {
            peer: 0,
            expected_op: silvic_net::Op::AllreduceMaxF64,
            got_op: silvic_net::Op::AllreduceSumF64,
            ..
        }
    ));
    assert!(
        matches!(results[0].0, CollectiveError::OutOfStep { peer: 1 | 2, .. }),
        "{}",
        results[0].0
    );
    for (rank, (error, later)) in results.iter().enumerate() {
        let out_of_step = match error {
            CollectiveError::Aborted { cause, .. } => &**cause,
            other => other,
        };
        assert!(matches!(out_of_step, CollectiveError::OutOfStep { .. }), "rank {rank}: {error}");
        assert_eq!(error, later, "rank {rank}: the error must stick");
    }
}

#[test]
fn ranks_passing_different_lengths_fail_with_a_length_mismatch() {
    for len_of_rank_2 in [99, 10_000] {
        let results = ring_of_threads(4, LIMIT, move |rank, mut ring| {
            let mut buf = vec![1_i64; if rank == 2 { len_of_rank_2 } else { 1000 }];
            ring.allreduce_sum_i64(&mut buf).unwrap_err()
        });
        assert_eq!(
            results[3],
            CollectiveError::LengthMismatch {
                peer: 2,
                expected: 8000,
                got: len_of_rank_2 as u64 * 8
            }
        );
        for (rank, error) in results.iter().enumerate() {
            let cause = match error {
                CollectiveError::Aborted { cause, .. } => &**cause,
                other => other,
            };
            assert!(
                matches!(cause, CollectiveError::LengthMismatch { .. }),
                "rank {rank}: {error}"
            );
        }
    }
}

/// World 3, rank 2's buffer one element longer. Rank 1 calls only once rank 2's call has
/// failed, so rank 2 hears of the mismatch from rank 0, which found it in rank 2's frame: its
/// error still names rank 0, never rank 2 itself (a rank is not its own peer), as the mismatch
/// seen from rank 2. Every rank's `peer()` is another rank.
#[test]
fn a_rank_told_of_its_own_mismatch_names_the_origin_not_itself() {
    let rank_2_failed = Arc::new(Barrier::new(2));
    let results = ring_of_threads(3, LIMIT, move |rank, mut ring| {
        let mut buf = vec![1_i64; if rank == 2 { 100_001 } else { 100_000 }];
        if rank == 1 {
            rank_2_failed.wait();
        }
        let error = ring.allreduce_sum_i64(&mut buf).unwrap_err();
        if rank == 2 {
            rank_2_failed.wait();
        }
        error
    });
    assert_eq!(
        results[2],
        CollectiveError::LengthMismatch { peer: 0, expected: 800_008, got: 800_000 },
        "{}",
        results[2]
    );
    assert_eq!(
        results[0],
        CollectiveError::LengthMismatch { peer: 2, expected: 800_000, got: 800_008 }
    );
    for (rank, error) in results.iter().enumerate() {
        let peer = error.peer().unwrap_or_else(|| panic!("rank {rank} names no peer: {error}"));
        assert_ne!(peer, rank, "rank {rank} names itself: {error}");
    }
}

#[test]
fn allgather_of_different_lengths_fails_on_every_rank() {
    let results = ring_of_threads(3, LIMIT, |rank, mut ring| {
        ring.allgather_bytes(&vec![0; 10 + rank]).unwrap_err()
    });
    for (rank, error) in results.iter().enumerate() {
        assert!(error.peer().is_some(), "rank {rank}: {error}");
    }
}

#[test]
fn a_silent_rank_times_out_its_neighbours_and_the_failure_travels() {
    // Rank 1 stays alive and silent until both others have failed: its silence, not its
    // close, must be what ends their calls, however slow the machine.
    let others_failed = Arc::new(Barrier::new(3));
    let results = ring_of_threads(3, LIMIT, move |rank, mut ring| {
        ring.set_timeout(Duration::from_millis(1500));
        if rank == 1 {
            others_failed.wait();
            return None;
        }
        let mut buf = vec![1.0; 100_000];
        let t = Instant::now();
        let error = ring.allreduce_sum_f64(&mut buf).unwrap_err();
        let elapsed = t.elapsed();
        others_failed.wait();
        Some((error, elapsed))
    });
    // Ranks 0 and 2 are both neighbours of the silent rank 1 and both wait on it: rank 2 for
    // its data, rank 0 for taking what it sends (and for rank 2's data, while rank 2 itself
    // waits). Whichever times out first aborts, and the other may hear that abort before its own
    // timeout fires: which one depends on when each thread began its call. Either way each
    // error is a timeout naming the rank it waited on, its own or as its neighbour's cause.
    let timeout = |rank: usize, error: &CollectiveError| match error {
        CollectiveError::Timeout { peer, waited } => {
            let named = if rank == 2 { &[1][..] } else { &[1, 2][..] };
            assert!(named.contains(peer), "rank {rank} timed out on rank {peer}");
            assert_eq!(*waited, Duration::from_millis(1500), "rank {rank}");
        }
        other => panic!("rank {rank}: {other}"),
    };
    let mut timed_out = 0;
    for (rank, other) in [(0, 2), (2, 0)] {
        let (error, elapsed) = results[rank].clone().unwrap();
        match &error {
            CollectiveError::Aborted { origin, cause } if *origin == other => timeout(other, cause),
            _ => {
                timeout(rank, &error);
                timed_out += 1;
                // A timeout fires no earlier than its timeout. (How late is bounded by LIMIT:
                // rank 1 waits for both errors, so a missing timeout is a hang that fails the
                // test.)
                assert!(
                    elapsed >= Duration::from_millis(1400),
                    "rank {rank} failed early: {elapsed:?}"
                );
            }
        }
    }
    assert!(timed_out >= 1, "no rank timed out: {results:?}");
}

#[test]
fn a_wrong_job_token_fails_fast_with_the_reason_and_never_shows_the_token() {
    let (listeners, addresses) = common::listeners(3);
    let timeout = Duration::from_secs(10);
    let results = connect_each(listeners.into_iter().enumerate().collect(), |rank| {
        let token = if rank == 1 { "wrong-secret-1" } else { "right-secret-0" };
        (addresses.clone(), token, timeout)
    });
    // Rank 1 is refused by rank 2: it fails fast, with the reason, naming rank 2.
    let (_, result, elapsed) = &results[1];
    let error = result.as_ref().unwrap_err();
    assert!(
        matches!(
            error,
            ConnectError::Rejected { peer: 2, reason: RejectReason::TokenMismatch, .. }
        ),
        "{error}"
    );
    let message = error.to_string();
    assert!(message.starts_with("job token mismatch with rank 2 at 127.0.0.1:"), "{message}");
    // Fast means: told, not timed out.
    assert!(*elapsed < timeout, "rank 1 waited out the timeout: {elapsed:?}");
    // Rank 0 is refused by rank 1 if it reaches rank 1 before rank 1 gives up, else it waits
    // for rank 1 until the timeout; rank 2 never gets a left neighbour with the right token.
    // Rank 2 also dials rank 0, which closes its listener as soon as rank 1 refuses it: if that
    // comes before rank 2's handshake with rank 0 is done, rank 2 is left waiting for rank 0.
    for rank in [0, 2] {
        let (_, result, elapsed) = &results[rank];
        let error = result.as_ref().unwrap_err();
        let about_rank_1 = matches!(
            error,
            ConnectError::Rejected { peer: 1, reason: RejectReason::TokenMismatch, .. }
                | ConnectError::Timeout { peer: 1, .. }
        );
        let rank_0_gave_up = rank == 2 && matches!(error, ConnectError::Timeout { peer: 0, .. });
        assert!(about_rank_1 || rank_0_gave_up, "rank {rank}: {error}");
        assert!(*elapsed < timeout + MARGIN, "rank {rank} took {elapsed:?}");
    }
    for (_, result, _) in &results {
        let error = result.as_ref().unwrap_err();
        assert!(!format!("{error} {error:?}").contains("secret"), "the token leaked: {error:?}");
    }
}

#[test]
fn a_wrong_world_size_is_refused_as_another_address_list() {
    let (listeners, addresses) = common::listeners(3);
    let mut longer = addresses.clone();
    longer.push("127.0.0.1:1".into());
    let timeout = Duration::from_secs(10);
    let results = connect_each(listeners.into_iter().enumerate().collect(), |rank| {
        let list = if rank == 0 { longer.clone() } else { addresses.clone() };
        (list, "t", timeout)
    });
    let (_, result, elapsed) = &results[0];
    let error = result.as_ref().unwrap_err();
    assert!(
        matches!(
            error,
            ConnectError::Rejected { peer: 1, reason: RejectReason::AddressMismatch, .. }
        ),
        "{error}"
    );
    // A listener refuses a Hello of another address list before it looks at the world, and
    // tells its reason only, not its own world size: this rank says its own.
    assert!(
        error.to_string().ends_with(
            ": the ranks were handed different address lists (this rank's has 4 addresses)"
        ),
        "{error}"
    );
    assert!(*elapsed < timeout, "rank 0 waited out the timeout: {elapsed:?}");
    for (rank, result, _) in &results[1..] {
        assert!(result.is_err(), "rank {rank} formed a ring with a rank of another world");
    }
}

#[test]
fn a_rank_that_never_shows_up_fails_connect_within_the_timeout() {
    let (listeners, addresses) = common::listeners(3);
    let timeout = Duration::from_secs(2);
    // Rank 2's listener is dropped: it never shows up.
    let present = listeners.into_iter().enumerate().filter(|(rank, _)| *rank != 2).collect();
    let results = connect_each(present, |_| (addresses.clone(), "t", timeout));
    for (rank, result, elapsed) in results {
        let error = result.unwrap_err();
        assert!(matches!(error, ConnectError::Timeout { peer: 2, .. }), "rank {rank}: {error}");
        assert!(elapsed >= timeout && elapsed < timeout + MARGIN, "{elapsed:?}");
    }
}

/// A stray the rendezvous waited on would hold the ring for the stray's whole handshake
/// deadline (5 s, the behaviour's own bound), or for ever: the silent strays stay open
/// throughout.
#[test]
fn silent_and_garbage_strays_do_not_stop_the_ring() {
    let listeners: Vec<_> = (0..3).map(|_| TcpCollective::bind("127.0.0.1").unwrap()).collect();
    let addresses: Vec<String> = listeners.iter().map(|l| l.address()).collect();
    let mut strays = Vec::new();
    for address in &addresses {
        for k in 0..4 {
            let mut s = TcpStream::connect(address).unwrap();
            if k % 2 == 1 {
                s.write_all(&[0x42; 200]).unwrap();
            }
            strays.push(s); // silent ones stay open through the rendezvous
        }
    }
    let mut ranks = common::Ranks::new();
    for (rank, listener) in listeners.into_iter().enumerate() {
        ranks.start(rank, listener, addresses.clone(), "t", CONNECT_TIMEOUT, move |ring, took| {
            let mut buf = vec![rank as f64; 5000];
            ring.unwrap().allreduce_sum_f64(&mut buf).unwrap();
            (took, buf[4999])
        });
    }
    for (formed, value) in ranks.join(LIMIT) {
        assert_eq!(value, 3.0);
        assert!(formed < Duration::from_secs(5), "strays delayed the ring: {formed:?}");
    }
    drop(strays);
}

#[test]
fn unreachable_bind_addresses_are_refused_and_bind_advertised_works() {
    for host in ["0.0.0.0", "::"] {
        let error = TcpCollective::bind(host).unwrap_err();
        assert!(matches!(error, ConnectError::InvalidArgument(_)), "{host}: {error}");
        assert!(error.to_string().contains("bind_advertised"), "{error}");
    }
    let error = TcpCollective::bind_advertised("0.0.0.0", "0.0.0.0").unwrap_err();
    assert!(matches!(error, ConnectError::InvalidArgument(_)));

    let listeners: Vec<_> =
        (0..2).map(|_| TcpCollective::bind_advertised("0.0.0.0", "127.0.0.1").unwrap()).collect();
    let addresses: Vec<String> = listeners.iter().map(|l| l.address()).collect();
    assert!(addresses.iter().all(|a| a.starts_with("127.0.0.1:")), "{addresses:?}");
    let results = ring_of(listeners, &addresses, "t", CONNECT_TIMEOUT, LIMIT, |rank, mut ring| {
        ring.allgather_bytes(&[rank as u8]).unwrap()
    });
    assert_eq!(results, [vec![vec![0], vec![1]], vec![vec![0], vec![1]]]);
}

#[test]
fn ipv6_addresses_are_bracketed() {
    let listener = TcpCollective::bind("::1").unwrap();
    assert!(listener.address().starts_with("[::1]:"), "{}", listener.address());
}

/// `connect` returns within its timeout plus a second whatever a peer does before the ring
/// forms: it goes silent (its port takes the connection and answers nothing), or it trickles
/// its handshake a byte at a time on both streams, each byte in time for any per-read wait.
#[test]
fn connect_meets_its_deadline_under_a_peer_that_goes_silent_or_trickles() {
    use std::net::TcpListener;
    use std::thread;
    for trickle in [false, true] {
        let listener = TcpCollective::bind("127.0.0.1").unwrap();
        let own = listener.address();
        let peer = TcpListener::bind("127.0.0.1:0").unwrap();
        let addresses = vec![own.clone(), peer.local_addr().unwrap().to_string()];
        let until = Instant::now() + LIMIT;
        let peer = thread::spawn(move || {
            if !trickle {
                thread::sleep(Duration::from_secs(4));
                return drop(peer);
            }
            let slowly = |mut stream: TcpStream| {
                thread::spawn(move || {
                    for byte in b"SILVICNT".iter().chain(&[0u8; 64]).cycle() {
                        if stream.write_all(&[*byte]).is_err() || Instant::now() > until {
                            return;
                        }
                        thread::sleep(Duration::from_millis(200));
                    }
                })
            };
            let dialled = slowly(TcpStream::connect(&own).unwrap());
            let accepted = slowly(peer.accept().unwrap().0);
            let _ = (dialled.join(), accepted.join());
        });
        let timeout = Duration::from_secs(2);
        let started = Instant::now();
        let e = TcpCollective::connect(listener, 0, &addresses, "t", timeout).map(drop);
        let took = started.elapsed();
        assert!(took <= timeout + Duration::from_secs(1), "trickle {trickle}: {took:?}");
        let e = e.unwrap_err();
        assert!(matches!(e, ConnectError::Timeout { peer: 1, .. }), "trickle {trickle}: {e}");
        drop(peer);
    }
}

/// A rank whose caller handed it arguments it cannot even build a call from (LightGBM's hooks,
/// through the Python binding) refuses the call: every other rank's call fails naming it,
/// at once, instead of waiting out its timeout for a rank that never joined the call.
#[test]
fn a_rank_that_refuses_a_call_fails_every_other_rank_naming_it() {
    use silvic_net::{Op, TrainerCollective};
    let results = ring_of_threads(3, LIMIT, |rank, mut ring| {
        ring.set_timeout(LIMIT);
        let started = Instant::now();
        let error = if rank == 1 {
            ring.refuse(Op::AllgatherBlocks, "LightGBM passed a null output")
        } else {
            let mut buf = vec![0u8; 12];
            ring.allgather_blocks(&mut buf, &[4, 4, 4]).unwrap_err()
        };
        let later = ring.allgather_bytes(b"x").unwrap_err();
        (error, later, started.elapsed())
    });
    let refused =
        CollectiveError::InvalidArgument { reason: "LightGBM passed a null output".into() };
    assert_eq!(results[1].0, refused);
    for (rank, (error, later, took)) in results.into_iter().enumerate() {
        assert_eq!(error, later, "rank {rank}: the failure must stick");
        assert!(took < LIMIT / 2, "rank {rank} waited {took:?}");
        if rank != 1 {
            assert_eq!(
                error,
                CollectiveError::Aborted { origin: 1, cause: Box::new(refused.clone()) },
                "rank {rank}"
            );
        }
    }
}

/// `connect` returns within its timeout plus a second under a peer that forms the ring and then
/// sends waiting notices for ever, on both streams and for every probe call, however a notice
/// might count as a sign of life: once the ring has formed, the probes wait no longer than
/// `connect`'s deadline either.
#[test]
fn connect_meets_its_deadline_under_a_peer_that_sends_waiting_notices_for_ever() {
    use silvic_net::frame::Waiting;
    use silvic_net::handshake::{Acceptor, Connector, MESSAGE_LEN, Message, Next, roster_digest};
    use std::io::Read;
    use std::net::TcpListener;
    use std::thread;

    const TOKEN: &str = "notices-for-ever-token-0123456789";
    let listener = TcpCollective::bind("127.0.0.1").unwrap();
    let peer = TcpListener::bind("127.0.0.1:0").unwrap();
    let addresses = vec![listener.address(), peer.local_addr().unwrap().to_string()];
    let parsed: Vec<std::net::SocketAddr> = addresses.iter().map(|a| a.parse().unwrap()).collect();
    let roster = roster_digest(&parsed);
    let until = Instant::now() + LIMIT;
    // Rank 1: both handshakes done honestly, then notices for ever (until rank 0 goes).
    let rank1 = {
        let own = addresses[0].clone();
        thread::spawn(move || {
            let exchange = |stream: &mut TcpStream,
                            first: Option<Message>,
                            mut role: Box<dyn FnMut(&Message) -> Next>| {
                if let Some(m) = first {
                    stream.write_all(&m.encode()).unwrap();
                }
                let mut inbox = [0u8; MESSAGE_LEN];
                loop {
                    stream.read_exact(&mut inbox).unwrap();
                    match role(&Message::decode(&inbox).unwrap()) {
                        Next::Send(m) => stream.write_all(&m.encode()).unwrap(),
                        Next::SendAndDone(m) => return stream.write_all(&m.encode()).unwrap(),
                        Next::Done => return,
                        Next::Fail(f, _) => panic!("rank 1's handshake: {f:?}"),
                    }
                }
            };
            let (mut dialled, _) = peer.accept().unwrap();
            let mut acceptor = Acceptor::new(TOKEN.as_bytes(), roster, 2, 1, 0, [1; 16]);
            exchange(&mut dialled, None, Box::new(move |m| acceptor.on_message(m)));
            let mut dialling = TcpStream::connect(&own).unwrap();
            let (mut connector, hello) =
                Connector::start(TOKEN.as_bytes(), roster, 2, 1, 0, [2; 16]);
            exchange(&mut dialling, Some(hello), Box::new(move |m| connector.on_message(m)));
            for stream in [&dialled, &dialling] {
                stream.set_nonblocking(true).unwrap();
            }
            let mut drain = [0u8; 4096];
            'notices: while Instant::now() < until {
                for seq in (u64::MAX - 31)..=u64::MAX {
                    let notice = Waiting { on: 0, waited: Duration::from_millis(500) }.encode(seq);
                    for mut stream in [&dialled, &dialling] {
                        let _ = stream.read(&mut drain);
                        match stream.write(&notice) {
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(_) => break 'notices, // rank 0 has gone
                        }
                    }
                }
                thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let timeout = Duration::from_secs(2);
    let started = Instant::now();
    let outcome = TcpCollective::connect(listener, 0, &addresses, TOKEN, timeout);
    let took = started.elapsed();
    assert!(took <= timeout + Duration::from_secs(1), "connect took {took:?}");
    let error = outcome.map(drop).unwrap_err();
    assert!(matches!(error, ConnectError::Timeout { peer: 1, .. }), "{error}");
    rank1.join().unwrap();
}
