//! A delaying TCP relay: the delay and jitter this kernel's missing netem would have added.
//!
//! It reads `FWD <listen ip:port> <target ip:port>` lines on stdin, answers `LISTENING <addr>`
//! for each, and forwards every connection it accepts to the target, holding each chunk it reads
//! for `delay + U(0, jitter)` before writing it on. Release times never go backwards, so bytes
//! stay in order (a stream cannot be reordered); jitter shows as bursts and gaps, as on a
//! congested path. End of stream and errors are passed on (a shutdown for a clean end, a close
//! for an error), so the ring sees its peers' closes through the relay.
//!
//! Bounded: at most [`QUEUE`] chunks of [`CHUNK`] bytes wait per direction, and it exits when
//! stdin closes (the harness dropped it).

use std::io::{BufRead, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::sync_channel;
use std::thread;
use std::time::{Duration, Instant};

use crate::data::mix;

/// Largest chunk read at once.
pub const CHUNK: usize = 64 << 10;
/// Chunks held per direction.
pub const QUEUE: usize = 64;

/// Runs the relay until stdin closes; returns the process exit code.
pub fn main(words: &[String]) -> i32 {
    let mut delay = Duration::from_millis(10);
    let mut jitter = Duration::ZERO;
    for word in words {
        match word.split_once('=') {
            Some(("delay_ms", v)) => delay = Duration::from_millis(v.parse().unwrap_or(10)),
            Some(("jitter_ms", v)) => jitter = Duration::from_millis(v.parse().unwrap_or(0)),
            _ => {
                eprintln!("relay: unknown argument {word}");
                return 64;
            }
        }
    }
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
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
        match TcpListener::bind(listen) {
            Ok(listener) => {
                println!("LISTENING {listen}");
                thread::spawn(move || accept_loop(listener, target, delay, jitter));
            }
            Err(e) => println!("RELAY_ERR {listen}: {e}"),
        }
        let _ = std::io::stdout().flush();
    }
    0
}

fn accept_loop(listener: TcpListener, target: SocketAddr, delay: Duration, jitter: Duration) {
    for (n, incoming) in listener.incoming().enumerate() {
        let Ok(client) = incoming else { continue };
        let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(5)) else {
            continue;
        };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        let seed = mix(n as u64 ^ u64::from(target.port()) << 32);
        for (from, to, seed) in [(&client, &server, seed), (&server, &client, !seed)] {
            let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else { continue };
            thread::spawn(move || pump(from, to, delay, jitter, seed));
        }
    }
}

/// Copies `from` to `to`, each chunk released `delay + U(0, jitter)` after it was read.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration, jitter: Duration, seed: u64) {
    let (send, recv) = sync_channel::<(Instant, Vec<u8>)>(QUEUE);
    let writer = thread::spawn(move || {
        for (release, chunk) in recv {
            thread::sleep(release.saturating_duration_since(Instant::now()));
            if to.write_all(&chunk).is_err() {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let mut last = Instant::now();
    let mut buf = vec![0u8; CHUNK];
    for n in 0u64.. {
        let read = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let extra = if jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_micros(mix(seed ^ n) % jitter.as_micros().max(1) as u64)
        };
        last = last.max(Instant::now() + delay + extra);
        if send.send((last, buf[..read].to_vec())).is_err() {
            break;
        }
    }
    drop(send);
    let _ = writer.join();
}
