//! Keeps TCP_USER_TIMEOUT from failing a neighbour that is alive but not reading.
//!
//! Linux applies TCP_USER_TIMEOUT to zero-window probing too: once the receiver has advertised
//! a zero window for longer than the timeout, the sender's connection is aborted with
//! `ETIMEDOUT`, although the receiver's kernel answers every probe (kernel 5.11 onwards;
//! measured on 6.18 with a 5 s timeout: aborted after 5.4 s). A rank that is paused or busy for
//! longer than [`LIVENESS`] while its left neighbour has bytes queued to it would so fail the
//! ring, where SPEC.md wants it waited for up to the collective timeout.
//!
//! So when a collective has waited [`CHECK_EVERY`] without a byte moving, the right stream's
//! row of `/proc/net/tcp` (or `tcp6`) is read. The zero-window probe timer (`tr` 4) with no
//! unanswered probe means the neighbour's kernel is alive and its window closed: then the
//! stream's TCP_USER_TIMEOUT is raised to the collective timeout. It is put back to
//! [`LIVENESS`] as soon as the neighbour is seen otherwise: a byte written (the window opened),
//! or a later check that finds the window open or a probe unanswered (the host may be gone, and
//! the kernel then fails the stream at its next probe). Data in flight, and keepalive on idle
//! streams, keep the one-minute bound throughout.
//!
//! Without a readable `/proc/net/tcp` nothing is raised: a neighbour that stops reading for
//! longer than [`LIVENESS`] then fails the collective, as it would without this module.
//!
//! Not covered: a rank outside any collective (between calls) does not check, so a neighbour
//! that stops reading bytes it has queued for longer than [`LIVENESS`] still fails its stream.

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use socket2::{SockRef, TcpKeepalive};
use tracing::debug;

/// How long TCP itself waits on a host that stopped answering (keepalive probes unanswered, or
/// data unacknowledged) before it fails the connection, whatever the collective timeout.
pub const LIVENESS: Duration = Duration::from_secs(60);
/// A stream idle this long gets a keepalive probe. Short, because a probe is also how a rank
/// that only waits learns that its peer's host answers with resets (a peer that lost its
/// connection state, a firewall): the reset comes back within moments of the probe. Vanished
/// hosts are still given [`LIVENESS`] (TCP_USER_TIMEOUT bounds keepalive too).
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_PROBES: u32 = 11;

/// Sets what every ring stream needs: non-blocking, no Nagle delay, and the liveness tier
/// (keepalive probes and TCP_USER_TIMEOUT) so a vanished host is found by TCP itself.
pub(crate) fn configure(stream: &TcpStream) -> std::io::Result<()> {
    stream.set_nonblocking(true)?;
    stream.set_nodelay(true)?;
    let socket = SockRef::from(stream);
    socket.set_tcp_keepalive(
        &TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_PROBES),
    )?;
    socket.set_tcp_user_timeout(Some(LIVENESS))
}

/// How long a collective waits without progress before it looks at the right stream, and how
/// often it looks again: well inside [`LIVENESS`], so the raise comes before the kernel acts.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(10);

/// What the kernel's table says about a stream's sending side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SendSide {
    /// Zero-window probing, and the last probe was answered: the peer is alive, not reading.
    ClosedWindowAlive,
    /// Anything else: window open, data in flight, idle, or probes unanswered.
    Other,
}

/// Finds the row of socket `inode` in a `/proc/net/tcp`-format table.
fn parse_table(table: &str, inode: u64) -> Option<SendSide> {
    let inode = inode.to_string();
    table.lines().skip(1).find_map(|row| {
        let f: Vec<&str> = row.split_whitespace().collect();
        if f.get(9) != Some(&inode.as_str()) {
            return None;
        }
        let timer = f.get(5)?.split(':').next()?;
        let unanswered: u64 = f.get(8)?.parse().ok()?;
        Some(if timer == "04" && unanswered == 0 {
            SendSide::ClosedWindowAlive
        } else {
            SendSide::Other
        })
    })
}

fn send_side(stream: &TcpStream) -> Option<SendSide> {
    let inode = std::fs::metadata(format!("/proc/self/fd/{}", stream.as_raw_fd())).ok()?.ino();
    let table =
        if stream.local_addr().ok()?.is_ipv6() { "/proc/net/tcp6" } else { "/proc/net/tcp" };
    parse_table(&std::fs::read_to_string(table).ok()?, inode)
}

/// The liveness state of the right stream.
#[derive(Debug)]
pub(crate) struct Liveness {
    /// TCP_USER_TIMEOUT is raised.
    raised: bool,
    last_check: Option<Instant>,
}

impl Liveness {
    pub(crate) fn new() -> Self {
        Liveness { raised: false, last_check: None }
    }

    /// When the next check is due, given the last byte moved at `last_progress`.
    pub(crate) fn next_check(&self, last_progress: Instant) -> Instant {
        let after_stall = last_progress + CHECK_EVERY;
        self.last_check.map_or(after_stall, |c| after_stall.max(c + CHECK_EVERY))
    }

    /// Looks at `stream` if a check is due; raises or restores its TCP_USER_TIMEOUT.
    pub(crate) fn check(&mut self, stream: &TcpStream, last_progress: Instant, timeout: Duration) {
        let now = Instant::now();
        if now < self.next_check(last_progress) {
            return;
        }
        self.last_check = Some(now);
        match send_side(stream) {
            Some(SendSide::ClosedWindowAlive) if !self.raised => {
                let raised = timeout.max(LIVENESS);
                if SockRef::from(stream).set_tcp_user_timeout(Some(raised)).is_ok() {
                    debug!(
                        ?raised,
                        "right neighbour alive with a closed window; user timeout raised"
                    );
                    self.raised = true;
                }
            }
            Some(SendSide::ClosedWindowAlive) => {}
            _ => self.restore(stream),
        }
    }

    /// Puts TCP_USER_TIMEOUT back to [`LIVENESS`], if it was raised.
    pub(crate) fn restore(&mut self, stream: &TcpStream) {
        if self.raised && SockRef::from(stream).set_tcp_user_timeout(Some(LIVENESS)).is_ok() {
            debug!("user timeout back to the liveness bound");
            self.raised = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:A1B2 0100007F:1F90 01 00400000:00000000 04:00000BB8 00000000     0        0 4242 1 0000000000000000 20 4 30 10 -1
   1: 0100007F:A1B3 0100007F:1F90 01 00400000:00000000 04:00000BB8 00000003     0        2 4243 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:A1B4 0100007F:1F90 01 00001000:00000000 01:00000014 00000001     0        0 4244 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:A1B5 0100007F:1F90 01 00000000:00000000 02:00000BB8 00000000     0        0 4245 1 0000000000000000 20 4 30 10 -1
";

    #[test]
    fn a_probed_closed_window_with_answers_is_alive_and_nothing_else_is() {
        assert_eq!(parse_table(TABLE, 4242), Some(SendSide::ClosedWindowAlive));
        assert_eq!(parse_table(TABLE, 4243), Some(SendSide::Other), "2 probes unanswered");
        assert_eq!(parse_table(TABLE, 4244), Some(SendSide::Other), "retransmitting");
        assert_eq!(parse_table(TABLE, 4245), Some(SendSide::Other), "keepalive");
        assert_eq!(parse_table(TABLE, 9999), None);
        assert_eq!(parse_table("", 4242), None);
    }

    #[test]
    fn checks_wait_for_a_stall_and_then_space_out() {
        let mut l = Liveness::new();
        let t = Instant::now();
        assert_eq!(l.next_check(t), t + CHECK_EVERY);
        l.last_check = Some(t + CHECK_EVERY);
        assert_eq!(l.next_check(t), t + 2 * CHECK_EVERY);
        let later = t + 5 * CHECK_EVERY;
        assert_eq!(l.next_check(later), later + CHECK_EVERY);
    }

    /// On Linux with /proc: a receiver that never reads closes its window; the sender's row
    /// then shows the zero-window probe timer with every probe answered.
    #[test]
    fn a_receiver_that_stops_reading_is_seen_alive_with_a_closed_window() {
        use std::io::Write;
        if std::fs::metadata("/proc/net/tcp").is_err() {
            eprintln!("SKIPPED: no /proc/net/tcp");
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_receiver, _) = listener.accept().unwrap();
        sender.set_nonblocking(true).unwrap();
        let chunk = vec![0u8; 1 << 16];
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = None;
        while Instant::now() < deadline {
            while (&sender).write(&chunk).is_ok() {}
            seen = send_side(&sender);
            if seen == Some(SendSide::ClosedWindowAlive) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(seen, Some(SendSide::ClosedWindowAlive));
    }
}
