//! The ring_frames oracle: a real [`TcpCollective`] of rank 0 in a world of two, whose only
//! neighbour (rank 1, played here over loopback) passes the handshake honestly and then sends
//! the fuzzer's bytes as its frames, then closes.
//!
//! Checked: the collective returns (no panic, no hang), with an error naming rank 1 or with a
//! result that is what the frames said: for the small path, every element is the fold of this
//! rank's value and the one rank 1 sent; for an allgather, rank 1's block is its payload. A
//! failed ring returns the same error again on the next call.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use silvic_core::fold;
use silvic_net::frame::HEADER_LEN;
use silvic_net::handshake::{Acceptor, Connector, MESSAGE_LEN, Message, Next, roster_digest};
use silvic_net::{Collective, CollectiveError, TcpCollective};

const TOKEN: &[u8] = b"ring-frames-token";
/// How long a call may take before it counts as a hang: every input ends with a close.
const HANG: Duration = Duration::from_secs(5);

/// Plays one side of rank 1's handshake over a blocking stream.
fn handshake(
    stream: &mut TcpStream,
    mut next: impl FnMut(&Message) -> Next,
    first: Option<Message>,
) {
    if let Some(hello) = first {
        stream.write_all(&hello.encode()).expect("send hello");
    }
    loop {
        let mut bytes = [0u8; MESSAGE_LEN];
        stream.read_exact(&mut bytes).expect("read a handshake message");
        match next(&Message::decode(&bytes).expect("rank 0 speaks the protocol")) {
            Next::Send(m) => stream.write_all(&m.encode()).expect("send"),
            Next::SendAndDone(m) => return stream.write_all(&m.encode()).expect("send"),
            Next::Done => return,
            Next::Fail(failure, _) => panic!("rank 0 refused the honest neighbour: {failure:?}"),
        }
    }
}

/// A world of two: rank 0 a real TcpCollective, rank 1 two plain streams, handshakes done.
/// Returns rank 0 and the stream rank 1 writes to rank 0 on.
fn ring_of_two() -> (TcpCollective, TcpStream, TcpStream) {
    let listener = TcpCollective::bind("127.0.0.1").expect("bind rank 0");
    let fake = TcpListener::bind("127.0.0.1:0").expect("bind rank 1");
    let addresses = vec![listener.address(), fake.local_addr().unwrap().to_string()];
    let rank0_address = addresses[0].clone();
    let parsed: Vec<std::net::SocketAddr> = addresses.iter().map(|a| a.parse().unwrap()).collect();
    let roster = roster_digest(&parsed);
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(TcpCollective::connect(listener, 0, &addresses, "ring-frames-token", HANG));
    });
    // Rank 0 dials rank 1 (its right) and accepts rank 1 (its left).
    let (mut from_rank0, _) = fake.accept().expect("rank 0 dials rank 1");
    let mut acceptor = Acceptor::new(TOKEN, roster, 2, 1, 0, [1; 16]);
    handshake(&mut from_rank0, |m| acceptor.on_message(m), None);
    let mut to_rank0 = TcpStream::connect(rank0_address).expect("dial rank 0");
    let (mut connector, hello) = Connector::start(TOKEN, roster, 2, 1, 0, [2; 16]);
    handshake(&mut to_rank0, |m| connector.on_message(m), Some(hello));
    let ring = rx.recv_timeout(HANG).expect("rank 0 connects").expect("the ring forms");
    (ring, to_rank0, from_rank0)
}

/// What rank 0 is asked to do, and with what.
#[derive(Debug, Clone, Copy)]
enum Call {
    SumF64,
    SumI64,
    MaxF64,
    Gather,
}

/// What a call returned, in a form the oracle compares.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Reduced(Vec<u64>),
    Gathered(Vec<Vec<u8>>),
}

fn run(ring: &mut TcpCollective, call: Call, len: usize) -> Result<Outcome, CollectiveError> {
    let bits = |v: Vec<f64>| Outcome::Reduced(v.into_iter().map(f64::to_bits).collect());
    match call {
        Call::SumF64 | Call::MaxF64 => {
            let mut buf = local_f64(len);
            if matches!(call, Call::SumF64) {
                ring.allreduce_sum_f64(&mut buf)?;
            } else {
                ring.allreduce_max_f64(&mut buf)?;
            }
            Ok(bits(buf))
        }
        Call::SumI64 => {
            let mut buf: Vec<i64> = (0..len as i64).map(|i| i * 3 - 7).collect();
            ring.allreduce_sum_i64(&mut buf)?;
            Ok(Outcome::Reduced(buf.into_iter().map(|x| x as u64).collect()))
        }
        Call::Gather => Ok(Outcome::Gathered(ring.allgather_bytes(&local_bytes(len))?)),
    }
}

fn local_f64(len: usize) -> Vec<f64> {
    (0..len).map(|i| i as f64 * 0.5 - 3.0).collect()
}

fn local_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|i| i as u8).collect()
}

/// Checks a successful small-path result against the first frame rank 1 sent.
fn check_result(call: Call, len: usize, sent: &[u8], outcome: &Outcome) {
    let payload = &sent[HEADER_LEN.min(sent.len())..];
    let word = |i: usize| u64::from_le_bytes(payload[8 * i..8 * i + 8].try_into().unwrap());
    match (call, outcome) {
        (Call::Gather, Outcome::Gathered(blocks)) => {
            assert_eq!(blocks.len(), 2);
            assert_eq!(blocks[0], local_bytes(len), "this rank's own block changed");
            assert_eq!(blocks[1], payload[..len], "rank 1's block is not what it sent");
        }
        (Call::SumF64 | Call::MaxF64, Outcome::Reduced(got)) if len * 8 < 4096 => {
            let f = if matches!(call, Call::SumF64) { fold::sum_f64 } else { fold::max_f64 };
            for (i, (&g, mine)) in got.iter().zip(local_f64(len)).enumerate() {
                let theirs = f64::from_bits(word(i));
                let either = [f(mine, theirs).to_bits(), f(theirs, mine).to_bits()];
                assert!(
                    either.contains(&g),
                    "element {i}: {mine} and {theirs} gave {}",
                    f64::from_bits(g)
                );
            }
        }
        (Call::SumI64, Outcome::Reduced(got)) if len * 8 < 4096 => {
            for (i, &g) in got.iter().enumerate() {
                let mine = i as i64 * 3 - 7;
                assert_eq!(g as i64, mine.wrapping_add(word(i) as i64), "element {i}");
            }
        }
        _ => {}
    }
}

/// One input: `[call, len_lo, len_hi, stream...]`.
pub fn ring_frames(data: &[u8]) {
    let [selector, lo, hi, stream @ ..] = data else { return };
    let call = [Call::SumF64, Call::SumI64, Call::MaxF64, Call::Gather][*selector as usize % 4];
    // Up to 700 elements: both sides of the 4 KiB small-path cut.
    let len = u16::from_le_bytes([*lo, *hi]) as usize % 701;
    let (mut ring, mut to_rank0, from_rank0) = ring_of_two();

    let (tx, rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        let first = run(&mut ring, call, len);
        let again = first.is_err().then(|| run(&mut ring, call, len));
        let _ = tx.send((first, again, ring));
    });
    // Rank 1's frames, then its close. Rank 0 may fail and close first: writes may then fail.
    let _ = to_rank0.write_all(stream);
    let _ = to_rank0.shutdown(Shutdown::Write);
    let started = Instant::now();
    let (first, again, ring) = rx.recv_timeout(HANG).unwrap_or_else(|_| {
        panic!("rank 0 did not return within {HANG:?} of rank 1's close ({:?})", started.elapsed())
    });
    worker.join().expect("the call panicked");
    // Rank 1 resets both streams before rank 0 closes, so that neither side keeps the
    // connections in TIME_WAIT: hundreds of rings a second would otherwise use up the ports.
    // (Rank 0's own frames sat in its socket buffer: nothing to read.)
    for stream in [&to_rank0, &from_rank0] {
        let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
    }
    drop((to_rank0, from_rank0));
    drop(ring);
    match (first, again) {
        (Ok(outcome), None) => check_result(call, len, stream, &outcome),
        (Err(e), Some(Err(again))) => {
            assert_eq!(again, e, "a failed ring returns the same error");
            // An abort from rank 1 names whatever rank it says; anything else names rank 1.
            if !matches!(e, CollectiveError::Aborted { .. }) {
                assert_eq!(e.peer(), Some(1), "the error names rank 1: {e}");
            }
        }
        other => panic!("impossible outcome {other:?}"),
    }
}
