//! The crate's only unsafe code: reading a stream's `TCP_INFO`, which neither rustix nor socket2
//! wraps. One call, one plain-integer struct; everything above it is safe.

use std::net::TcpStream;
use std::time::Duration;

/// What the kernel says about a TCP stream's sending side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TcpInfo {
    /// The window the peer last advertised, in bytes (0: it takes nothing now).
    pub(crate) send_window: u32,
    /// Time since the peer last acknowledged anything (data, a probe or a keepalive).
    pub(crate) last_ack: Duration,
    /// Zero-window or keepalive probes sent and not answered.
    pub(crate) unanswered_probes: u8,
    /// The gap before the next probe: the retransmission timeout, doubled per backoff, at most
    /// the kernel's 120 s.
    pub(crate) probe_interval: Duration,
}

/// The kernel's upper bound on a retransmission or probe interval (TCP_RTO_MAX).
const RTO_MAX: Duration = Duration::from_secs(120);

/// Reads `TCP_INFO` of `stream`; `None` if the call fails or the kernel is too old to report
/// the send window (before Linux 5.4).
#[cfg(target_os = "linux")]
pub(crate) fn tcp_info(stream: &TcpStream) -> Option<TcpInfo> {
    let info = raw_tcp_info(stream)?;
    let rto = Duration::from_micros(info.tcpi_rto.into());
    Some(TcpInfo {
        send_window: info.tcpi_snd_wnd,
        last_ack: Duration::from_millis(info.tcpi_last_ack_recv.into()),
        unanswered_probes: info.tcpi_probes,
        probe_interval: rto.saturating_mul(1 << info.tcpi_backoff.min(16)).min(RTO_MAX),
    })
}

/// Whether the peer has acknowledged every byte written to `stream` (and its end, once the
/// stream is shut for writing): nothing waits to be sent and no segment is unacknowledged.
/// `None` where `TCP_INFO` does not say (see [`tcp_info`]).
#[cfg(target_os = "linux")]
pub(crate) fn all_acknowledged(stream: &TcpStream) -> Option<bool> {
    let info = raw_tcp_info(stream)?;
    Some(info.tcpi_unacked == 0 && info.tcpi_notsent_bytes == 0)
}

/// `TCP_INFO` as the kernel fills it, if it fills it as far as the send window (Linux 5.4).
#[cfg(target_os = "linux")]
fn raw_tcp_info(stream: &TcpStream) -> Option<libc::tcp_info> {
    use std::os::fd::AsRawFd;
    // SAFETY: `tcp_info` is a C struct of integers only, so all-zero bytes are a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the descriptor is open for the borrow of `stream`; `info` is a writable buffer of
    // `len` bytes that outlives the call; the kernel writes at most `len` bytes into it and
    // stores how many in `len`, which is a valid, writable socklen_t.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    let reported = std::mem::offset_of!(libc::tcp_info, tcpi_snd_wnd) + size_of::<u32>();
    (rc == 0 && (len as usize) >= reported).then_some(info)
}

/// Not reported off Linux.
#[cfg(not(target_os = "linux"))]
pub(crate) fn tcp_info(_: &TcpStream) -> Option<TcpInfo> {
    None
}

/// Not reported off Linux.
#[cfg(not(target_os = "linux"))]
pub(crate) fn all_acknowledged(_: &TcpStream) -> Option<bool> {
    None
}
