//! Keeps TCP_USER_TIMEOUT from failing a neighbour that is alive but not reading.
//!
//! Linux applies TCP_USER_TIMEOUT to zero-window probing too: once the receiver has advertised
//! a zero window for longer than the timeout, the sender's connection is aborted with
//! `ETIMEDOUT`, although the receiver's kernel answers every probe (Linux 5.11 onwards). A
//! rank that is paused or busy for longer than [`LIVENESS`] while a neighbour has bytes queued
//! to it would so fail the ring, where it should be waited for up to the collective timeout.
//! Data flows both ways round the ring (the two-way gather), so every stream a rank writes to
//! needs this, not only the one to its right: the link keeps one [`Liveness`] per stream.
//!
//! So when a collective has waited [`CHECK_EVERY`] without a byte moving on a stream, that
//! stream's own `TCP_INFO` is read ([`crate::sys`]). A closed send window with an
//! acknowledgement from the neighbour within the last [`LIVENESS`] plus one probe interval means
//! the neighbour's kernel is alive and its window closed: then the stream's TCP_USER_TIMEOUT is
//! raised to the collective timeout (clamped to what the kernel accepts, [`MAX_USER_TIMEOUT`]).
//! One lost probe does not undo that: a probe interval grows to 120 s after a long pause, so only
//! silence for longer than the liveness bound past the interval counts as a host gone.
//!
//! A raised stream stays raised while its neighbour answers, window open or not, and is put back
//! to [`LIVENESS`] only by a check that finds the neighbour silent that long (the kernel then
//! fails the stream at its next probe or retransmission). Never when the window merely opens
//! again: the kernel's zero-window clock starts at the first probe of a closed window and is
//! reset only when a window opens wide enough for the whole next queued segment (or when a probe
//! finds room to send data); a window that opens a little at a time, as a paused rank's does
//! once it reads again through small buffers, keeps the clock of the pause running. A stream put
//! back to the liveness bound as soon as the neighbour read again then failed at its next closed
//! window, as if the pause had never been waited for (a neighbour's stream timed out moments
//! after a 100 s pause ended: the `netns_channels` test bed). Data in flight to a neighbour never
//! raised, and keepalive on idle streams, keep the one-minute bound throughout; a vanished host
//! on a raised stream is found within the liveness bound plus two probe or retransmission
//! intervals and one check (at most about five minutes).
//!
//! Without `TCP_INFO` (not Linux, or a kernel before 5.4) nothing is raised: a neighbour that
//! stops reading for longer than [`LIVENESS`] then fails the collective, as it would without this
//! module. A socket option that cannot be set is logged as a warning, never silently ignored.
//!
//! Not covered: a rank outside any collective (between calls) does not check, so a neighbour
//! that stops reading bytes it has queued for longer than [`LIVENESS`] still fails its stream.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use socket2::{SockRef, TcpKeepalive};
use tracing::{debug, warn};

use crate::sys::{TcpInfo, tcp_info};

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

/// Sets what every ring stream needs: non-blocking, no Nagle delay, a congestion control other
/// than BBR (`crate::congestion`), and the liveness tier (keepalive probes and
/// TCP_USER_TIMEOUT) so a vanished host is found by TCP itself.
pub(crate) fn configure(stream: &TcpStream) -> std::io::Result<()> {
    stream.set_nonblocking(true)?;
    stream.set_nodelay(true)?;
    crate::congestion::configure(stream);
    let socket = SockRef::from(stream);
    socket.set_tcp_keepalive(
        &TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_PROBES),
    )?;
    socket.set_tcp_user_timeout(Some(bounds().0))
}

/// The longest TCP_USER_TIMEOUT Linux accepts: `i32::MAX` milliseconds (about 24.8 days). A
/// longer one is refused with `EINVAL`, which would leave the stream at its old value.
pub(crate) const MAX_USER_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// TCP_USER_TIMEOUT to raise a stream to for a collective `timeout`: never below the liveness
/// bound, never above [`MAX_USER_TIMEOUT`].
fn raised_timeout(timeout: Duration) -> Duration {
    timeout.clamp(bounds().0, MAX_USER_TIMEOUT)
}

/// How long a collective waits without progress on a stream before it looks at it, and how
/// often it looks again: well inside [`LIVENESS`], so the raise comes before the kernel acts.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(10);

/// The liveness bound and the check interval in force: [`LIVENESS`] and [`CHECK_EVERY`], except
/// on a thread where a test of this crate has scaled them down (`scale_on_this_thread`).
fn bounds() -> (Duration, Duration) {
    #[cfg(test)]
    if let Some(scaled) = SCALED.with(std::cell::Cell::get) {
        return scaled;
    }
    (LIVENESS, CHECK_EVERY)
}

#[cfg(test)]
thread_local! {
    static SCALED: std::cell::Cell<Option<(Duration, Duration)>> = const { std::cell::Cell::new(None) };
}

/// Scales the liveness bound and the check interval down on the calling thread, so that a test
/// of a pause past the bound takes seconds: streams it configures and checks on this thread use
/// these from now on.
#[cfg(test)]
pub(crate) fn scale_on_this_thread(liveness: Duration, check_every: Duration) {
    SCALED.with(|s| s.set(Some((liveness, check_every))));
}

/// What `TCP_INFO` says about a stream's sending side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SendSide {
    /// The window is closed and the neighbour's kernel answered recently: alive, not reading.
    ClosedWindowAlive,
    /// The window is open and the neighbour's kernel answered recently.
    Answering,
    /// The neighbour has not answered for longer than the liveness bound past a probe interval:
    /// its host may be gone.
    Silent,
}

fn send_side(info: &TcpInfo) -> SendSide {
    let answered = info.last_ack < bounds().0.saturating_add(info.probe_interval);
    match (answered, info.send_window) {
        (false, _) => SendSide::Silent,
        (true, 0) => SendSide::ClosedWindowAlive,
        (true, _) => SendSide::Answering,
    }
}

/// The liveness state of one stream.
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
        let every = bounds().1;
        let after_stall = last_progress + every;
        self.last_check.map_or(after_stall, |c| after_stall.max(c + every))
    }

    /// Looks at `stream` if a check is due at `now`: raises its TCP_USER_TIMEOUT where the
    /// neighbour is alive behind a closed window, and puts it back where the neighbour is silent
    /// (see the module doc: never merely because the window opened).
    pub(crate) fn check(
        &mut self,
        stream: &TcpStream,
        now: Instant,
        last_progress: Instant,
        timeout: Duration,
    ) {
        if now < self.next_check(last_progress) {
            return;
        }
        self.last_check = Some(now);
        match tcp_info(stream).as_ref().map(send_side) {
            Some(SendSide::ClosedWindowAlive) if !self.raised => {
                let raised = raised_timeout(timeout);
                match SockRef::from(stream).set_tcp_user_timeout(Some(raised)) {
                    Ok(()) => {
                        debug!(?raised, "neighbour alive with a closed window; raised");
                        self.raised = true;
                    }
                    Err(error) => warn!(%error, ?raised, "cannot raise TCP_USER_TIMEOUT"),
                }
            }
            Some(SendSide::Silent) => self.restore(stream),
            Some(SendSide::ClosedWindowAlive | SendSide::Answering) | None => {}
        }
    }

    /// Puts TCP_USER_TIMEOUT back to the liveness bound, if it was raised.
    fn restore(&mut self, stream: &TcpStream) {
        if !self.raised {
            return;
        }
        match SockRef::from(stream).set_tcp_user_timeout(Some(bounds().0)) {
            Ok(()) => {
                debug!("user timeout back to the liveness bound");
                self.raised = false;
            }
            Err(error) => warn!(%error, "cannot restore TCP_USER_TIMEOUT"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(send_window: u32, last_ack_s: u64, probes: u8, interval_s: u64) -> TcpInfo {
        TcpInfo {
            send_window,
            last_ack: Duration::from_secs(last_ack_s),
            unanswered_probes: probes,
            probe_interval: Duration::from_secs(interval_s),
        }
    }

    #[test]
    fn a_closed_window_answered_within_the_bound_is_alive_even_after_a_lost_probe() {
        assert_eq!(send_side(&info(0, 1, 0, 1)), SendSide::ClosedWindowAlive);
        // After a long pause probes come 120 s apart; one of them lost is not a dead host.
        assert_eq!(send_side(&info(0, 150, 1, 120)), SendSide::ClosedWindowAlive);
        assert_eq!(send_side(&info(0, 181, 2, 120)), SendSide::Silent, "silent past the bound");
        assert_eq!(send_side(&info(0, 61, 3, 0)), SendSide::Silent);
        assert_eq!(send_side(&info(65536, 0, 0, 1)), SendSide::Answering, "window open");
        assert_eq!(send_side(&info(65536, 181, 2, 120)), SendSide::Silent);
    }

    /// On Linux with BBR the system's default (as some kernels ship it), a ring stream still
    /// runs another congestion control.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_configured_stream_is_off_bbr() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let socket = SockRef::from(&stream);
        if socket.set_tcp_congestion(b"bbr").is_err() {
            eprintln!("bbr is not available here: nothing to switch off");
            return;
        }
        configure(&stream).unwrap();
        let now = socket.tcp_congestion().unwrap();
        assert!(!now.starts_with(b"bbr"), "{}", String::from_utf8_lossy(&now));
    }

    #[test]
    fn the_raised_timeout_is_clamped_to_what_the_kernel_accepts() {
        assert_eq!(raised_timeout(Duration::from_secs(5)), LIVENESS);
        assert_eq!(raised_timeout(Duration::from_secs(1800)), Duration::from_secs(1800));
        assert_eq!(raised_timeout(Duration::from_secs(30 * 86_400)), MAX_USER_TIMEOUT);
        assert_eq!(raised_timeout(Duration::MAX), MAX_USER_TIMEOUT);
        // The kernel takes it: set on a real socket, read back.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let socket = SockRef::from(&stream);
        socket.set_tcp_user_timeout(Some(raised_timeout(Duration::MAX))).unwrap();
        assert_eq!(socket.tcp_user_timeout().unwrap(), Some(MAX_USER_TIMEOUT));
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

    /// A receiver that never reads closes its window; the sender's TCP_INFO then shows the
    /// closed window with the receiver's kernel answering. Linux only (the one place TCP_INFO
    /// is read); elsewhere `tcp_info` is `None` and nothing is raised.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_receiver_that_stops_reading_is_seen_alive_with_a_closed_window() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_receiver, _) = listener.accept().unwrap();
        sender.set_nonblocking(true).unwrap();
        let open = tcp_info(&sender).expect("TCP_INFO on Linux 5.4 or later");
        assert_eq!(send_side(&open), SendSide::Answering, "an idle stream's window is open");
        let chunk = vec![0u8; 1 << 16];
        // Bounded poll: the window closes once the receiver's buffer is full.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = None;
        while Instant::now() < deadline {
            while (&sender).write(&chunk).is_ok() {}
            seen = tcp_info(&sender);
            if seen.as_ref().map(send_side) == Some(SendSide::ClosedWindowAlive) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let seen = seen.unwrap();
        assert_eq!(send_side(&seen), SendSide::ClosedWindowAlive, "{seen:?}");
    }
}
