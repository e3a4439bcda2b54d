//! The rendezvous under adversity: a late Welcome, strangers that try to evict the real
//! neighbour, ranks handed different address lists, what a refusal tells a stranger, and the
//! warning for a short job token. Every rank runs as a thread with its own rendezvous timeout,
//! and every wait is bounded: a hang fails the test.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use silvic_net::handshake::{Connector, MESSAGE_LEN, Message, MessageKind, roster_digest};
use silvic_net::{Collective, ConnectError, RejectReason, RingListener, TcpCollective};
use silvic_testbed::relay::Link;

const TOKEN: &str = "a-rendezvous-test-token-0123456789";
/// What the accepting side holds at most (`MAX_PENDING` in src/rendezvous/accept.rs).
const MAX_PENDING: usize = 256;
/// How long a stranger has to finish its handshake (`HANDSHAKE_DEADLINE` in accept.rs).
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

/// A listener the other ranks reach through a relay, every rank holding the same address list:
/// the rank listens on 127.0.0.1:P and advertises 127.0.0.2:P, where the returned relay
/// listener sits. Returns both listeners and the rank's own address, for the relay. (The
/// shared relay, `common::listeners_with_relay`, delays whole streams; holding back one
/// handshake message needs this one.)
fn bind_behind_relay() -> (RingListener, TcpListener, String) {
    for _ in 0..50 {
        let listener = TcpCollective::bind_advertised("127.0.0.1", "127.0.0.2").unwrap();
        let port: u16 = listener.address().rsplit(':').next().unwrap().parse().unwrap();
        if let Ok(relay) = TcpListener::bind(("127.0.0.2", port)) {
            return (listener, relay, format!("127.0.0.1:{port}"));
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

/// Copies `from` to `to` until either ends, waiting `delay` before each chunk.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf) {
        thread::sleep(delay); // the link's latency, not synchronisation
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// What a rank's connect returned and how long it took, as [`common::Ranks`] reports it.
fn joined(ring: Result<TcpCollective, ConnectError>, took: Duration) -> Joined {
    (ring, took)
}

type Joined = (Result<TcpCollective, ConnectError>, Duration);

/// Both ranks of a world of two joined: checks one allreduce over the ring.
fn check_ring(mut rings: Vec<TcpCollective>) {
    let handles: Vec<_> = rings
        .drain(..)
        .map(|mut ring| {
            thread::spawn(move || {
                let mut x = vec![ring.rank() as f64 + 1.0; 1000];
                ring.allreduce_sum_f64(&mut x).map(|()| x)
            })
        })
        .collect();
    for h in handles {
        let x = h.join().unwrap().expect("the ring works");
        assert!(x.iter().all(|&v| v == 3.0));
    }
}

/// The connecting rank proves itself, and the accepting rank, having checked the proof,
/// counts the link as formed. The Welcome then takes longer than a stranger is given: the
/// connecting rank must keep waiting for it, not redial a listener that is no longer taking
/// connections (which left it waiting out the whole timeout).
#[test]
fn a_welcome_held_past_the_stranger_deadline_still_forms_the_ring() {
    let (behind, relay, direct) = bind_behind_relay();
    let listeners = vec![TcpCollective::bind("127.0.0.1").unwrap(), behind];
    let addresses: Vec<String> = listeners.iter().map(|l| l.address()).collect();
    let hold = HANDSHAKE_DEADLINE + Duration::from_secs(1);
    let connections = Arc::new(AtomicUsize::new(0));
    {
        let connections = connections.clone();
        thread::spawn(move || {
            // Forwards rank 0's connections to rank 1; of rank 1's answers, the Challenge
            // passes at once and the Welcome after `hold`.
            for client in relay.incoming() {
                let Ok(client) = client else { return };
                connections.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(&direct) else { return };
                let (c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                thread::spawn(move || pump(client, server, Duration::ZERO));
                thread::spawn(move || {
                    let mut c2 = c2;
                    let mut message = [0u8; MESSAGE_LEN];
                    if s2.read_exact(&mut message).is_err() || c2.write_all(&message).is_err() {
                        return;
                    }
                    if s2.read_exact(&mut message).is_err() {
                        return;
                    }
                    thread::sleep(hold); // the fault under test: a late Welcome
                    if c2.write_all(&message).is_ok() {
                        pump(s2, c2, Duration::ZERO);
                    }
                });
            }
        });
    }
    let timeout = Duration::from_secs(40);
    let mut ranks = common::Ranks::new();
    for (rank, listener) in listeners.into_iter().enumerate() {
        ranks.start(rank, listener, addresses.clone(), TOKEN, timeout, joined);
    }
    let mut rings = Vec::new();
    for (rank, (result, took)) in ranks.join(timeout + common::MARGIN).into_iter().enumerate() {
        let ring = result.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        if rank == 0 {
            assert!(took >= hold, "the Welcome was not held: rank 0 joined in {took:?}");
        }
        rings.push(ring);
    }
    // One connection per channel (a ring on several cores forms more than one), none redialled.
    let channels = rings[0].channel_stats().len();
    assert_eq!(connections.load(Ordering::SeqCst), channels, "rank 0 redialled after its proof");
    check_ring(rings);
}

/// A stranger from `source` (a loopback address other than the neighbour's) that connects to
/// `target` and sends a Hello valid for this job's ranks and address list: it needs no token.
fn hello_stranger(source: &str, target: SocketAddr, roster: [u8; 32]) -> Option<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    let from: SocketAddr = format!("{source}:0").parse().unwrap();
    socket.bind(&from.into()).ok()?;
    socket.connect_timeout(&target.into(), Duration::from_secs(3)).ok()?;
    let mut stream: TcpStream = socket.into();
    let (_, hello) = Connector::start(b"not-the-token", roster, 2, 0, 1, [7; 16]);
    stream.write_all(&hello.encode()).ok()?;
    Some(stream)
}

/// Whether a held stranger got a Challenge (it is in a handshake slot), within `limit`.
fn challenged(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut message = [0u8; MESSAGE_LEN];
    stream.set_read_timeout(Some(limit)).unwrap();
    stream.read_exact(&mut message).is_ok()
        && Message::decode(&message).is_ok_and(|m| m.kind == MessageKind::Challenge)
}

/// The eviction attack: the accepting rank's handshake slots are full of strangers that sent
/// valid Hellos (any address list is public), and more keep arriving, right after the real
/// neighbour and faster than it can prove itself over a slow link. None of them has proven
/// anything, and they come from addresses other than the neighbour's advertised one: they go
/// first, and the ring forms.
#[test]
fn strangers_with_valid_hellos_cannot_evict_the_left_neighbour() {
    // Rank 0 reaches rank 1 over a link with 250 ms each way: it proves itself a second or so
    // after it connects, while the strangers stream in (straight to rank 1).
    let delay = Duration::from_millis(250);
    let (listeners, addresses, relay) =
        common::listeners_with_relay(2, 1, Link { delay, record: MESSAGE_LEN, ..Link::default() });
    let parsed: Vec<SocketAddr> = addresses.iter().map(|a| a.parse().unwrap()).collect();
    let roster = roster_digest(&parsed);
    let target = common::behind(&relay);
    let sources: Vec<String> = (10..26).map(|i| format!("127.0.0.{i}")).collect();
    let timeout = Duration::from_secs(20);
    let mut ranks = common::Ranks::new();
    let mut listeners = listeners.into_iter();
    let (rank0, rank1) = (listeners.next().unwrap(), listeners.next().unwrap());
    ranks.start(1, rank1, addresses.clone(), TOKEN, timeout, joined);

    // First the slots fill with strangers that were each challenged.
    let mut held = Vec::new();
    let mut in_slots = 0;
    for i in 0..(MAX_PENDING + 64) {
        let source = &sources[i % sources.len()];
        let Some(mut stream) = hello_stranger(source, target, roster) else { continue };
        in_slots += usize::from(challenged(&mut stream, Duration::from_secs(5)));
        held.push(stream);
    }
    assert!(in_slots >= MAX_PENDING, "only {in_slots} strangers were challenged");

    // Then a stream of them, from two threads, while the real neighbour joins.
    let stop = Arc::new(AtomicBool::new(false));
    let streamers: Vec<_> = (0..2)
        .map(|t| {
            let (stop, sources) = (stop.clone(), sources.clone());
            thread::spawn(move || {
                let mut keep = std::collections::VecDeque::new();
                let mut opened = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let source = &sources[(opened * 2 + t) % sources.len()];
                    if let Some(stream) = hello_stranger(source, target, roster) {
                        opened += 1;
                        if keep.len() == 1000 {
                            keep.pop_front();
                        }
                        keep.push_back(stream);
                    }
                }
                opened
            })
        })
        .collect();
    let flood_started = Instant::now();
    ranks.start(0, rank0, addresses, TOKEN, timeout, joined);
    let mut rings = Vec::new();
    for (rank, (result, _)) in ranks.join(timeout + common::MARGIN).into_iter().enumerate() {
        rings.push(result.unwrap_or_else(|e| panic!("rank {rank}: {e}")));
    }
    stop.store(true, Ordering::Relaxed);
    let flooded_for = flood_started.elapsed();
    let opened: usize = streamers.into_iter().map(|s| s.join().unwrap()).sum();
    // The attack means something only if it could have pushed the neighbour out by age alone:
    // more than MAX_PENDING valid Hellos per round trip of the neighbour's link.
    let per_round_trip = opened as f64 * (2 * delay).as_secs_f64() / flooded_for.as_secs_f64();
    eprintln!("{opened} strangers in {flooded_for:?}: {per_round_trip:.0} per round trip");
    assert!(
        per_round_trip > MAX_PENDING as f64,
        "the strangers were too slow: {per_round_trip:.0}"
    );
    // Not even a retry: the neighbour's first connection of each channel (each Hello names its
    // channel) was never dropped for room.
    let mut hellos: Vec<u16> = relay
        .recorded()
        .iter()
        .map(|hello| Message::decode(hello.as_slice().try_into().unwrap()).unwrap().channel)
        .collect();
    hellos.sort_unstable();
    let channels: Vec<u16> = (0..rings[0].channel_stats().len() as u16).collect();
    assert_eq!(hellos, channels, "the neighbour was evicted and redialled");
    check_ring(rings);
    drop(held);
}

/// Rank 2 is handed an address list whose entry for rank 1 differs: same length, so the world
/// sizes agree. Both links that involve rank 2 fail at once, with that reason, instead of
/// forming a ring the ranks disagree about.
#[test]
fn ranks_handed_different_address_lists_fail_with_a_clear_error() {
    let (listeners, addresses) = common::listeners(3);
    let mut other = addresses.clone();
    other[1] = "127.0.0.1:1".into();
    let timeout = Duration::from_secs(10);
    let results = common::connect_each(listeners.into_iter().enumerate().collect(), |rank| {
        let list = if rank == 2 { other.clone() } else { addresses.clone() };
        (list, TOKEN, timeout)
    });
    let mismatch = |rank: usize, peer: usize| {
        let (_, result, _) = &results[rank];
        let error = result.as_ref().err().unwrap_or_else(|| panic!("rank {rank} joined"));
        assert!(
            matches!(
                error,
                ConnectError::Rejected { peer: p, reason: RejectReason::AddressMismatch, .. }
                    if *p == peer
            ),
            "rank {rank}: {error}"
        );
        let text = error.to_string();
        assert!(text.starts_with(&format!("address list mismatch with rank {peer} at ")), "{text}");
    };
    // Rank 2 dials rank 0 and is refused by rank 0's list. Rank 1 dials rank 2 and is refused
    // by rank 2's list when rank 2 answers it before its own refusal ends its rendezvous;
    // otherwise rank 2's listener is gone, and rank 1 fails on rank 2 all the same.
    mismatch(2, 0);
    let (_, rank1, _) = &results[1];
    let Err(error) = rank1 else { panic!("rank 1 joined a ring with a rank of another list") };
    assert_eq!(error.peer(), Some(2), "rank 1: {error}");
    if matches!(error, ConnectError::Rejected { .. }) {
        mismatch(1, 2);
    }
    assert!(results[0].1.is_err(), "rank 0 formed a ring with a rank of another list");
}

/// A stranger that sends a Hello with wrong claims is told why, and nothing about the rank
/// that refused it: no rank, world size or version.
#[test]
fn a_refusal_tells_a_stranger_only_the_reason() {
    let (mut listeners, addresses) = common::listeners(2);
    let rank1 = listeners.pop().unwrap();
    let target: SocketAddr = addresses[1].parse().unwrap();
    let mut ranks = common::Ranks::new();
    ranks.start(1, rank1, addresses, TOKEN, Duration::from_secs(2), joined);
    for (world, rank) in [(5, 0), (2, 1)] {
        let mut stream = TcpStream::connect_timeout(&target, Duration::from_secs(3)).unwrap();
        let (_, hello) = Connector::start(b"whatever", [0; 32], world, rank, 1, [1; 16]);
        stream.write_all(&hello.encode()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut bytes = [0u8; MESSAGE_LEN];
        stream.read_exact(&mut bytes).expect("a refusal");
        let refusal = Message::decode(&bytes).unwrap();
        assert!(matches!(refusal.kind, MessageKind::Reject(_)), "{refusal:?}");
        let told = (refusal.version, refusal.world, refusal.rank, refusal.nonce, refusal.mac);
        assert_eq!(told, (0, 0, 0, [0; 16], [0; 32]), "the refusal said more than why");
    }
    let (result, _) = ranks.join(Duration::from_secs(2) + common::MARGIN).remove(0);
    assert!(matches!(result, Err(ConnectError::Timeout { .. })), "{:?}", result.err());
}

/// What the ranks logged while forming a world of two with `token` (both hold it).
fn logged_while_connecting(token: &'static str) -> String {
    // The process's global subscriber, not a scoped one: tracing decides once per call site
    // whether it is wanted, and while one subscriber exists it asks only the default of the
    // thread that reaches the call site first. A scoped subscriber on this thread would be
    // missed whenever rank 1's thread got there first, muting the warning for rank 0 too.
    static LOG: OnceLock<common::Capture> = OnceLock::new();
    let captured = LOG.get_or_init(|| {
        let capture = common::Capture::default();
        tracing::subscriber::set_global_default(capture.subscriber()).expect("no other subscriber");
        capture
    });
    captured.clear();
    let (mut listeners, addresses) = common::listeners(2);
    let rank1 = listeners.pop().unwrap();
    let rank0 = listeners.pop().unwrap();
    let timeout = Duration::from_secs(20);
    let mut peer = common::Ranks::new();
    peer.start(1, rank1, addresses.clone(), token, timeout, |ring, _| {
        ring.map(|_| ()).map_err(|e| e.to_string())
    });
    TcpCollective::connect(rank0, 0, &addresses, token, timeout).expect("rank 0 joins");
    peer.join(timeout + common::MARGIN).remove(0).expect("rank 1 joins");
    captured.text()
}

#[test]
fn a_short_job_token_draws_a_warning_that_does_not_show_it() {
    let short = logged_while_connecting("job-42");
    assert!(short.contains("shorter than 16 bytes"), "no warning: {short:?}");
    assert!(!short.contains("job-42"), "the token was logged: {short:?}");
    let long = logged_while_connecting(TOKEN);
    assert!(!long.contains("shorter than"), "a long token drew a warning: {long:?}");
}
