//! The one TCP relay of the tests: a slow link (delay and jitter, with no need of the kernel's
//! netem) and a wiretap (the first bytes each client sent), in one place.
//!
//! A [`Relay`] listens on an address and forwards every connection it accepts to a target, as a
//! link of the given [`Link`] would: the upstream connection is opened `delay` after the client's
//! (the SYN crosses the link too), and each chunk read is released `delay + U(0, jitter)` after it
//! was read. Release times never go backwards, so bytes stay in order (a stream cannot be
//! reordered); jitter shows as bursts and gaps, as on a congested path. A [`Link::rate`] caps
//! each direction of each connection, as a cloud NIC caps a flow: a chunk leaves the wire only
//! when the chunks before it have, at that rate, and the relay reads no further ahead than one
//! chunk past what the wire has sent, so a sender sees the cap as TCP back-pressure, not as a
//! deep queue. End of stream and errors
//! are passed on (a shutdown for a clean end, a close for an error), so each side sees the
//! other's close through the relay.
//!
//! Tests in a process use [`Relay::start`]; the namespace test bed runs the same code as a
//! process in the switch namespace ([`main`], `silvic-testbed relay`), which reads
//! `FWD <listen ip:port> <target ip:port>` lines on stdin and answers `LISTENING <addr>` for each.
//!
//! Bounded: at most [`QUEUE`] chunks of [`CHUNK`] bytes wait per direction; a relay stops
//! accepting when dropped, and the process exits when stdin closes (the harness dropped it).

use std::io::{self, BufRead, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::data::mix;

/// Largest chunk read at once.
pub const CHUNK: usize = 64 << 10;
/// Chunks held per direction.
pub const QUEUE: usize = 64;

/// What the relay does to each connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Link {
    /// One-way delay of the connection and of every chunk.
    pub delay: Duration,
    /// Extra delay drawn uniformly from `0..jitter` per chunk.
    pub jitter: Duration,
    /// Keep the first `record` bytes each client sent (see [`Relay::recorded`]).
    pub record: usize,
    /// Bytes a second each direction of each connection carries at most; `None` for no cap.
    pub rate: Option<u64>,
}

/// When a chunk read now leaves a wire of `rate` bytes a second that is busy until `free`, and
/// when the wire is free again: the chunk waits for the chunks before it, then takes
/// `len / rate` of wire time.
fn on_the_wire(now: Instant, free: Instant, len: usize, rate: u64) -> (Instant, Instant) {
    let start = free.max(now);
    let busy = Duration::from_secs_f64(len as f64 / rate.max(1) as f64);
    (start, start + busy)
}

type Records = Arc<Mutex<Vec<Arc<Mutex<Vec<u8>>>>>>;

/// A running relay. Dropping it stops accepting; connections already forwarded run on until
/// either side closes.
#[derive(Debug)]
pub struct Relay {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    records: Records,
    accept: Option<JoinHandle<()>>,
}

impl Relay {
    /// Listens on `listen` (port 0 for any) and forwards each connection to `target`.
    pub fn start(listen: SocketAddr, target: SocketAddr, link: Link) -> io::Result<Relay> {
        let listener = TcpListener::bind(listen)?;
        let address = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let records: Records = Arc::default();
        let accept = {
            let (stop, records) = (stop.clone(), records.clone());
            thread::spawn(move || accept_loop(listener, target, link, &stop, &records))
        };
        Ok(Relay { address, stop, records, accept: Some(accept) })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The first [`Link::record`] bytes each client sent so far, by connection in accept order.
    pub fn recorded(&self) -> Vec<Vec<u8>> {
        self.records.lock().unwrap().iter().map(|r| r.lock().unwrap().clone()).collect()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop, which then sees the flag and closes the listener.
        let _ = TcpStream::connect_timeout(&self.address, Duration::from_secs(1));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    link: Link,
    stop: &AtomicBool,
    records: &Records,
) {
    for (n, incoming) in listener.incoming().enumerate() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(client) = incoming else { continue };
        let record = Arc::new(Mutex::new(Vec::new()));
        records.lock().unwrap().push(record.clone());
        let seed = mix(n as u64 ^ u64::from(target.port()) << 32);
        thread::spawn(move || forward(client, target, link, seed, &record));
    }
}

type Chunks = Receiver<(Instant, Vec<u8>)>;

/// One connection: what the client sends is read (and timed) at once, while the upstream
/// connection is opened `delay` after the client's, as the client's SYN would have arrived.
fn forward(client: TcpStream, target: SocketAddr, link: Link, seed: u64, record: &Mutex<Vec<u8>>) {
    let accepted = Instant::now();
    let Ok(from_client) = client.try_clone() else { return };
    let (send, upstream) = sync_channel(QUEUE);
    let writer = thread::spawn(move || {
        thread::sleep((accepted + link.delay).saturating_duration_since(Instant::now()));
        let server = match TcpStream::connect_timeout(&target, Duration::from_secs(5)) {
            Ok(server) => server,
            Err(_) => return drop(client.shutdown(Shutdown::Both)),
        };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        let Ok(from_server) = server.try_clone() else { return };
        let back = thread::spawn(move || {
            let (send, downstream) = sync_channel(QUEUE);
            let writer = thread::spawn(move || write_chunks(downstream, client));
            read_chunks(from_server, &send, link, !seed, None);
            drop(send);
            let _ = writer.join();
        });
        write_chunks(upstream, server);
        let _ = back.join();
    });
    read_chunks(from_client, &send, link, seed, Some(record));
    drop(send);
    let _ = writer.join();
}

/// Reads `from` until it ends, each chunk stamped to be released `delay + U(0, jitter)` after it
/// was read.
fn read_chunks(
    mut from: TcpStream,
    send: &SyncSender<(Instant, Vec<u8>)>,
    link: Link,
    seed: u64,
    record: Option<&Mutex<Vec<u8>>>,
) {
    let mut last = Instant::now();
    let mut free = last;
    let mut buf = vec![0u8; CHUNK];
    for n in 0u64.. {
        if let Some(rate) = link.rate {
            // Read no further ahead than one chunk's wire time before the wire is free, so the
            // sender is held back by TCP as by a capped flow, not queued behind megabytes.
            let ahead = Duration::from_secs_f64(CHUNK as f64 / rate.max(1) as f64);
            thread::sleep(free.saturating_duration_since(Instant::now() + ahead));
        }
        let read = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if let Some(record) = record {
            let mut kept = record.lock().unwrap();
            let room = link.record.saturating_sub(kept.len()).min(read);
            kept.extend_from_slice(&buf[..room]);
        }
        let extra = if link.jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_micros(mix(seed ^ n) % link.jitter.as_micros().max(1) as u64)
        };
        let now = Instant::now();
        let sent = match link.rate {
            Some(rate) => {
                let (_, done) = on_the_wire(now, free, read, rate);
                free = done;
                done
            }
            None => now,
        };
        last = last.max(sent + link.delay + extra);
        if send.send((last, buf[..read].to_vec())).is_err() {
            break;
        }
    }
}

/// Writes each chunk to `to` at its release time; passes the end on as a shutdown, an error as
/// a close.
fn write_chunks(chunks: Chunks, mut to: TcpStream) {
    for (release, chunk) in chunks {
        thread::sleep(release.saturating_duration_since(Instant::now()));
        if to.write_all(&chunk).is_err() {
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Runs the relay process until stdin closes; returns the process exit code.
///
/// Arguments: `delay_ms=N jitter_ms=N flow_mbit=N` (no cap without `flow_mbit`).
pub fn main(words: &[String]) -> i32 {
    let mut link = Link { delay: Duration::from_millis(10), ..Link::default() };
    for word in words {
        match word.split_once('=') {
            Some(("delay_ms", v)) => link.delay = Duration::from_millis(v.parse().unwrap_or(10)),
            Some(("jitter_ms", v)) => link.jitter = Duration::from_millis(v.parse().unwrap_or(0)),
            Some(("flow_mbit", v)) => match v.parse::<u64>() {
                Ok(mbit @ 1..) => link.rate = Some(mbit * 1_000_000 / 8),
                _ => {
                    eprintln!("relay: flow_mbit must be a whole number of Mbit/s, at least 1");
                    return 64;
                }
            },
            _ => {
                eprintln!("relay: unknown argument {word}");
                return 64;
            }
        }
    }
    let mut relays = Vec::new();
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let parts: Vec<&str> = line.split_whitespace().collect();
        let (Some(&"FWD"), Some(listen), Some(target)) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            eprintln!("relay: bad line {line:?}");
            continue;
        };
        let (Ok(listen), Ok(target)) = (listen.parse::<SocketAddr>(), target.parse::<SocketAddr>())
        else {
            eprintln!("relay: bad addresses in {line:?}");
            continue;
        };
        match Relay::start(listen, target, link) {
            Ok(relay) => {
                println!("LISTENING {}", relay.address());
                relays.push(relay);
            }
            Err(e) => println!("RELAY_ERR {listen}: {e}"),
        }
        let _ = io::stdout().flush();
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server behind a relay: bytes come back in order, no sooner than two delays, and
    /// the first bytes the client sent are on record.
    #[test]
    fn a_relay_delays_forwards_in_order_and_records() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap();
        let server = thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = s.read(&mut buf) {
                s.write_all(&buf[..n]).unwrap();
            }
        });
        let delay = Duration::from_millis(30);
        let link = Link { delay, jitter: Duration::from_millis(5), record: 4, rate: None };
        let relay = Relay::start("127.0.0.1:0".parse().unwrap(), target, link).unwrap();
        let started = Instant::now();
        let mut client = TcpStream::connect(relay.address()).unwrap();
        let sent: Vec<u8> = (0..20_000u32).map(|i| mix(u64::from(i)) as u8).collect();
        let writer = {
            let mut w = client.try_clone().unwrap();
            let sent = sent.clone();
            thread::spawn(move || {
                w.write_all(&sent).unwrap();
                w.shutdown(Shutdown::Write).unwrap();
            })
        };
        let mut got = Vec::new();
        client.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        client.read_to_end(&mut got).unwrap();
        writer.join().unwrap();
        server.join().unwrap();
        assert_eq!(got, sent);
        assert!(started.elapsed() >= 2 * delay, "came back after {:?}", started.elapsed());
        assert_eq!(relay.recorded(), vec![sent[..4].to_vec()]);
    }

    /// A chunk waits for the wire to be free, then takes its length at the rate.
    #[test]
    fn a_chunk_takes_its_wire_time_after_the_chunks_before_it() {
        let now = Instant::now();
        let (start, done) = on_the_wire(now, now, 1000, 1_000_000);
        assert_eq!((start, done), (now, now + Duration::from_millis(1)));
        let busy_until = now + Duration::from_millis(5);
        let (start, done) = on_the_wire(now, busy_until, 500, 1_000_000);
        assert_eq!((start, done), (busy_until, busy_until + Duration::from_micros(500)));
        let later = now + Duration::from_millis(9);
        assert_eq!(on_the_wire(later, busy_until, 0, 1_000_000), (later, later));
    }

    /// A capped relay cannot deliver faster than its rate: 1 MiB at 4 MiB/s takes a quarter
    /// of a second at least (the first chunk's wire time aside), and arrives whole and in order.
    #[test]
    fn a_capped_flow_carries_no_more_than_its_rate() {
        let sink = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = sink.local_addr().unwrap();
        let server = thread::spawn(move || {
            let (mut s, _) = sink.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            (got, Instant::now())
        });
        let rate = 4 << 20;
        let link = Link { rate: Some(rate), ..Link::default() };
        let relay = Relay::start("127.0.0.1:0".parse().unwrap(), target, link).unwrap();
        let sent: Vec<u8> = (0..1u32 << 20).map(|i| mix(u64::from(i)) as u8).collect();
        let started = Instant::now();
        let mut client = TcpStream::connect(relay.address()).unwrap();
        client.write_all(&sent).unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let (got, ended) = server.join().unwrap();
        assert!(got == sent, "the bytes changed on the way");
        let least = Duration::from_secs_f64((sent.len() - CHUNK) as f64 / rate as f64);
        let took = ended - started;
        assert!(took >= least, "1 MiB crossed a 4 MiB/s flow in {took:?}");
    }
}
