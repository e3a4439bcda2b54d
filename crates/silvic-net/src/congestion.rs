//! Keeps a ring stream off BBR, a congestion control that stalls the ring's bursts behind a
//! shaped link.
//!
//! A ring call is a burst of frames after a pause (a rank computing), often to both neighbours
//! at once through one egress. BBR paces each stream at its estimate of the path's bandwidth,
//! and on a host whose egress is shaped (tc tbf at 1 Gbit/s, `crates/silvic-testbed/src/net.rs`)
//! that estimate of a ring stream now and then collapses to a few Mbit/s. Since BBR stamps each
//! packet with a send time at the rate of the moment, a stream then holds frames it could send
//! for tens of milliseconds, nothing in flight, and every rank waits on it. Loss-based
//! congestion control (CUBIC, Linux's default) does not pace, and the shaper alone sets the
//! rate.
//!
//! Invariants:
//! - A stream whose congestion control is BBR (any version: its name starts with `bbr`) is
//!   switched to CUBIC; any other choice (CUBIC, Reno, DCTCP, one the operator picked) is kept.
//! - The choice is made before a ring connection exists: on the listener, whose accepted
//!   streams inherit it, and on a dialling socket before it connects; every stream is checked
//!   again once formed. A stream that starts on BBR keeps BBR's pacing after a switch (Linux
//!   leaves a socket's pacing on once BBR has turned it on), and paced ring streams are slower
//!   even on loopback.
//! - A switch that fails (CUBIC not built, or not allowed to this process) is logged as a
//!   warning and the stream keeps BBR: it is slower, never broken.
//! - Only Linux is touched; elsewhere the system's choice stands.

/// The congestion control a stream running `current` should switch to, if any.
fn replacement(current: &[u8]) -> Option<&'static [u8]> {
    current.starts_with(b"bbr").then_some(b"cubic")
}

/// A congestion control's name as `TCP_CONGESTION` gives it, without the NUL padding.
fn name(raw: &[u8]) -> &[u8] {
    raw.split(|&b| b == 0).next().unwrap_or_default()
}

/// Switches `socket` (a stream, a listener, or a socket yet to connect) off BBR (see the module
/// doc). Returns the congestion control it runs afterwards, where the system says.
#[cfg(target_os = "linux")]
pub(crate) fn configure<S: std::os::fd::AsFd>(socket: &S) -> Option<Vec<u8>> {
    use socket2::SockRef;
    use tracing::warn;

    let socket = SockRef::from(socket);
    let current = match socket.tcp_congestion() {
        Ok(raw) => name(&raw).to_vec(),
        Err(error) => {
            warn!(%error, "cannot read the stream's congestion control");
            return None;
        }
    };
    let Some(next) = replacement(&current) else {
        return Some(current);
    };
    match socket.set_tcp_congestion(next) {
        Ok(()) => Some(next.to_vec()),
        Err(error) => {
            let from = String::from_utf8_lossy(&current);
            warn!(%error, %from, "cannot switch the stream to cubic; it stays on {from}");
            Some(current)
        }
    }
}

/// Elsewhere than Linux the system's choice stands.
#[cfg(not(target_os = "linux"))]
pub(crate) fn configure<S>(_socket: &S) -> Option<Vec<u8>> {
    None
}

#[cfg(test)]
mod tests {
    use std::net::TcpStream;

    use super::*;

    #[test]
    fn a_name_ends_at_its_padding() {
        assert_eq!(name(b"cubic\0\0\0"), b"cubic");
        assert_eq!(name(b"bbr"), b"bbr");
        assert_eq!(name(b""), b"");
    }

    #[test]
    fn only_bbr_is_replaced_and_by_cubic() {
        assert_eq!(replacement(b"bbr"), Some(&b"cubic"[..]));
        assert_eq!(replacement(b"bbr2"), Some(&b"cubic"[..]));
        for kept in [&b"cubic"[..], b"reno", b"dctcp", b"", b"xbbr"] {
            assert_eq!(replacement(kept), None, "{}", String::from_utf8_lossy(kept));
        }
    }

    /// A loopback pair: (the connecting end, the accepted end).
    fn pair() -> (TcpStream, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dialed = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        (dialed, accepted)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_stream_on_bbr_is_switched_to_cubic_and_another_choice_is_kept() {
        let (stream, _peer) = pair();
        let socket = socket2::SockRef::from(&stream);
        // BBR is a module that a kernel may lack: where it cannot be chosen, there is nothing to
        // switch off, and only the choice that is kept is checked.
        if socket.set_tcp_congestion(b"bbr").is_ok() {
            assert_eq!(configure(&stream).as_deref(), Some(&b"cubic"[..]));
            assert_eq!(name(&socket.tcp_congestion().unwrap()), b"cubic");
        } else {
            eprintln!("bbr is not available here: only the kept choice is checked");
        }
        socket.set_tcp_congestion(b"reno").unwrap();
        assert_eq!(configure(&stream).as_deref(), Some(&b"reno"[..]));
        assert_eq!(name(&socket.tcp_congestion().unwrap()), b"reno");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_listener_and_a_dialling_socket_on_bbr_give_streams_that_never_ran_it() {
        use socket2::{Domain, Socket, Type};
        let socket = || Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        let (listener, dialler) = (socket(), socket());
        if listener.set_tcp_congestion(b"bbr").is_err() {
            eprintln!("bbr is not available here: nothing to switch off");
            return;
        }
        dialler.set_tcp_congestion(b"bbr").unwrap();
        listener.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
        listener.listen(1).unwrap();
        assert_eq!(configure(&listener).as_deref(), Some(&b"cubic"[..]));
        assert_eq!(configure(&dialler).as_deref(), Some(&b"cubic"[..]));
        dialler.connect(&listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        // Both ends of the connection run CUBIC from its first packet: the accepted one by
        // inheritance from the listener.
        assert_eq!(name(&accepted.tcp_congestion().unwrap()), b"cubic");
        assert_eq!(name(&dialler.tcp_congestion().unwrap()), b"cubic");
    }
}
