//! `--link-limit`: what the links carry in the ring's pattern, measured without the ring.
//!
//! Every rank opens one plain TCP connection to its right neighbour and streams into it for
//! `--seconds-per-size` seconds while it drains the one from its left, all ranks at once: host
//! `i` to host `i + 1`, as iperf3 flows laid out like the ring would be. Each rank's rate is the
//! bytes it received after a warm-up (a fifth of the time, past TCP's slow start) over the time
//! they took. The ring's busbw at large sizes is compared with these per-host rates.
//!
//! By default each flow writes and reads one 128 KiB chunk over and over, which stays in cache,
//! as iperf3 does. `--stream-bytes N` runs the flows through buffers of N bytes instead, so that
//! they touch as much memory as a call of that size does (all but the fold).
//!
//! The ranks trade the flows' addresses and their rates over the ring itself, which is idle
//! while the flows run.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use silvic_core::Collective;

use crate::cli::{Config, Format};
use crate::failure::Failure;
use crate::report::mbit_to_gbs;

/// Bytes one write or read moves (iperf3's default for TCP).
const CHUNK: usize = 128 * 1024;

/// One rank's measured flow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Flow {
    /// Bytes received after the warm-up.
    pub(crate) bytes: u64,
    /// Seconds they took.
    pub(crate) seconds: f64,
}

impl Flow {
    /// GB/s (10^9 bytes per second).
    pub(crate) fn rate(&self) -> f64 {
        if self.seconds > 0.0 { self.bytes as f64 / self.seconds / 1e9 } else { 0.0 }
    }
}

/// Runs the flows on this rank; rank 0 prints every rank's rate.
pub(crate) fn measure(
    ring: &mut dyn Collective,
    config: &Config,
    host: &str,
    preamble: &str,
) -> Result<u64, Failure> {
    let (rank, world) = (ring.rank(), ring.world_size());
    if world < 2 {
        return Err("--link-limit needs at least 2 ranks".into());
    }
    let advertised = (host, 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("{host:?} is not an address"))?;
    let listen = match &config.listen {
        Some(listen) => (listen.as_str(), 0)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| format!("{listen:?} is not an address"))?,
        None => advertised,
    };
    let listener = TcpListener::bind(listen)?;
    let address = SocketAddr::new(advertised.ip(), listener.local_addr()?.port());
    let addresses = ring.allgather_bytes(address.to_string().as_bytes())?;
    let right: SocketAddr = std::str::from_utf8(&addresses[(rank + 1) % world])
        .ok()
        .and_then(|a| a.parse().ok())
        .ok_or("the right neighbour sent no flow address")?;
    let seconds = config.seconds_per_size;
    let flow = std::thread::scope(|s| -> Result<Flow, Failure> {
        let (go, started) = channel();
        let sender = s.spawn(move || send(right, started, seconds, config));
        let (left, _) = listener.accept()?;
        drop(listener);
        // Every rank has accepted its left flow once this returns: start them together.
        // (On an error `go` is dropped, which stops the sender.)
        ring.allreduce_sum_f64(&mut [0.0])?;
        let _ = go.send(());
        let flow = receive(left, seconds, config);
        sender.join().map_err(|_| "the sending thread panicked")??;
        flow
    })?;
    let mut rates = vec![0.0; 2 * world];
    rates[2 * rank] = flow.bytes as f64;
    rates[2 * rank + 1] = flow.seconds;
    ring.allreduce_sum_f64(&mut rates)?;
    if rank == 0 {
        let flows: Vec<Flow> =
            rates.chunks_exact(2).map(|c| Flow { bytes: c[0] as u64, seconds: c[1] }).collect();
        print(config, preamble, &flows);
    }
    Ok(0)
}

/// The buffer a flow streams through ([`Config::stream_bytes`]), and where its next chunk
/// starts: chunks go round it in order, the last one cut short at its end.
struct StreamBuf {
    buf: Vec<u8>,
    at: usize,
}

impl StreamBuf {
    fn new(config: &Config) -> StreamBuf {
        StreamBuf { buf: vec![0x5a; config.stream_bytes.unwrap_or(CHUNK)], at: 0 }
    }

    /// The next chunk's place in the buffer.
    fn next(&self) -> std::ops::Range<usize> {
        self.at..(self.at + CHUNK).min(self.buf.len())
    }

    /// `n` bytes of the next chunk moved.
    fn advance(&mut self, n: usize) {
        self.at = (self.at + n) % self.buf.len();
    }
}

/// Connects to `right`, waits for `go`, then streams into it for `seconds` and closes the
/// stream's sending side.
fn send(right: SocketAddr, go: Receiver<()>, seconds: f64, config: &Config) -> Result<(), Failure> {
    let mut stream = TcpStream::connect_timeout(&right, config.timeout)?;
    stream.set_write_timeout(Some(config.timeout))?;
    let mut out = StreamBuf::new(config);
    go.recv().map_err(|_| "the flows never started")?;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        let chunk = out.next();
        let n = chunk.len();
        stream.write_all(&out.buf[chunk])?;
        out.advance(n);
    }
    stream.shutdown(Shutdown::Write)?;
    Ok(())
}

/// Drains `left` to its end; counts what arrives after the first fifth of `seconds`.
fn receive(mut left: TcpStream, seconds: f64, config: &Config) -> Result<Flow, Failure> {
    left.set_read_timeout(Some(config.timeout))?;
    let mut into = StreamBuf::new(config);
    let warm = Instant::now() + Duration::from_secs_f64(seconds / 5.0);
    let mut counted: Option<(Instant, u64)> = None;
    loop {
        let chunk = into.next();
        let n = left.read(&mut into.buf[chunk])?;
        if n == 0 {
            break;
        }
        into.advance(n);
        match &mut counted {
            Some((_, bytes)) => *bytes += n as u64,
            None if Instant::now() >= warm => counted = Some((Instant::now(), 0)),
            None => {}
        }
    }
    let (start, bytes) = counted.unwrap_or((Instant::now(), 0));
    Ok(Flow { bytes, seconds: start.elapsed().as_secs_f64() })
}

/// Prints the flows in the chosen format.
fn print(config: &Config, preamble: &str, flows: &[Flow]) {
    let link = config.link_mbit.map(mbit_to_gbs);
    let world = flows.len();
    let mut out = std::io::stdout().lock();
    match config.format {
        Format::Table => {
            let _ = writeln!(
                out,
                "{preamble}#\n# link limit: every host streams to the next (host i to i + 1), \
                 all at once, for {} s, through buffers of {} bytes\n\
                 #{:>5} {:>12} {:>9} {:>8}{}\n#{:>5} {:>12} {:>9} {:>8}{}",
                config.seconds_per_size,
                config.stream_bytes.unwrap_or(CHUNK),
                "host",
                "bytes",
                "seconds",
                "rate",
                if link.is_some() { format!(" {:>7}", "link") } else { String::new() },
                "",
                "",
                "(s)",
                "(GB/s)",
                if link.is_some() { format!(" {:>7}", "(share)") } else { String::new() },
            );
            for (h, f) in flows.iter().enumerate() {
                let share = link.map_or(String::new(), |l| format!(" {:>7.3}", f.rate() / l));
                let _ = writeln!(
                    out,
                    "{h:>6} {:>12} {:>9.3} {:>8.3}{share}",
                    f.bytes,
                    f.seconds,
                    f.rate()
                );
            }
            let rates = flows.iter().map(Flow::rate);
            let min = rates.clone().fold(f64::INFINITY, f64::min);
            let mean = rates.sum::<f64>() / world as f64;
            let _ = writeln!(out, "# per-host rate: min {min:.3} GB/s, mean {mean:.3} GB/s\n#");
        }
        Format::Csv => {
            let _ = writeln!(
                out,
                "world,rank,bytes,seconds,GBs,op{}",
                if link.is_some() { ",link" } else { "" }
            );
            for (h, f) in flows.iter().enumerate() {
                let share = link.map_or(String::new(), |l| format!(",{:.4}", f.rate() / l));
                let _ = writeln!(
                    out,
                    "{world},{h},{},{:.6},{:.4},link_limit{share}",
                    f.bytes,
                    f.seconds,
                    f.rate()
                );
            }
        }
        Format::Json => {
            for (h, f) in flows.iter().enumerate() {
                let row = serde_json::json!({
                    "op": "link_limit",
                    "world": world,
                    "rank": h,
                    "bytes": f.bytes,
                    "seconds": f.seconds,
                    "GBs": f.rate(),
                    "link": link.map(|l| f.rate() / l),
                    "link_GBs": link,
                    "stream_bytes": config.stream_bytes.unwrap_or(CHUNK),
                });
                let _ = writeln!(out, "{row}");
            }
        }
    }
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_rate_is_bytes_over_seconds() {
        assert_eq!(Flow { bytes: 3_000_000_000, seconds: 2.0 }.rate(), 1.5);
        assert_eq!(Flow { bytes: 5, seconds: 0.0 }.rate(), 0.0);
    }
}
