//! How a ring closes when it is dropped: every stream is shut for writing, what peers still send
//! is read and dropped, and a socket is closed once its peer has acknowledged everything this
//! rank wrote to it, or has ended its side, or [`CLOSE_LINGER`] (at most the collective timeout)
//! has passed.
//!
//! Why: Linux answers data that reaches a closed socket, or that lies unread in it when it is
//! closed, with a reset, and the reset discards what the socket had not delivered yet. A rank
//! that took its last frame may return and close while a neighbour still waits for a frame this
//! rank sent and the network lost once: the neighbour's waiting notice reaches the closed socket,
//! and the reset destroys the retransmission the neighbour waits for, so it fails a call that
//! had every byte on the way. Once the peer has acknowledged everything, its kernel holds the
//! bytes and a later reset costs it nothing.
//!
//! Invariants: the wait is bounded by [`CLOSE_LINGER`] and the timeout; it ends at once on a
//! stream whose peer has closed or failed, and without `TCP_INFO` a stream is closed as soon as
//! what it holds has been read.

use std::io::Read;
use std::net::Shutdown;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use super::TcpRing;
use super::stream::Stream;
use crate::wait::{nonblocking, wait};

/// The longest a dropped ring waits for its peers to acknowledge its last bytes.
pub(super) const CLOSE_LINGER: Duration = Duration::from_secs(5);

/// The longest gap between two looks at what the peers have acknowledged (an acknowledgement
/// wakes no poll(2)).
const LOOK_EVERY: Duration = Duration::from_millis(10);

impl Drop for TcpRing {
    fn drop(&mut self) {
        let deadline = Instant::now() + CLOSE_LINGER.min(self.watch.timeout());
        for stream in &self.streams.list {
            let _ = stream.socket.shutdown(Shutdown::Write);
        }
        let mut open: Vec<&Stream> = self.streams.list.iter().collect();
        let mut gap = Duration::from_micros(50);
        loop {
            open.retain(|stream| !settled(stream));
            let now = Instant::now();
            if open.is_empty() || now >= deadline {
                return;
            }
            let mut fds: Vec<PollFd<'_>> =
                open.iter().map(|s| PollFd::new(&s.socket, PollFlags::IN)).collect();
            if wait(&mut fds, Some((now + gap).min(deadline))).is_err() {
                return;
            }
            gap = (gap * 2).min(LOOK_EVERY);
        }
    }
}

/// Reads and drops what the peer has sent; true once the stream may be closed without a reset
/// costing the peer anything: it has ended or failed, or it has acknowledged every byte.
fn settled(stream: &Stream) -> bool {
    let mut sink = [0u8; 4096];
    loop {
        match nonblocking(|| (&stream.socket).read(&mut sink)) {
            Ok(Some(0)) | Err(_) => return true,
            Ok(Some(_)) => {}
            Ok(None) => return crate::sys::all_acknowledged(&stream.socket).unwrap_or(true),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    use super::*;

    /// A socket closed with unread bytes resets its peer, which then loses what it had not read
    /// yet; [`settled`] reads them first, so the peer reads everything and then the end.
    #[test]
    fn a_settled_stream_closes_without_a_reset() {
        for settle in [false, true] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server, _) = listener.accept().unwrap();
            server.set_nonblocking(true).unwrap();
            client.write_all(b"a waiting notice").unwrap();
            (&server).write_all(&[7; 1000]).unwrap();
            let stream = Stream::new(server, crate::ring::seam::Route::RIGHTWARD, 0, 2);
            // The bytes from the client reach the server before it closes.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !stream_has_bytes(&stream) {
                assert!(Instant::now() < deadline, "the client's bytes never arrived");
                std::thread::sleep(Duration::from_millis(1));
            }
            if settle {
                let _ = stream.socket.shutdown(Shutdown::Write);
                while !settled(&stream) {
                    assert!(Instant::now() < deadline, "never acknowledged on loopback");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            drop(stream);
            client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut got = Vec::new();
            let read = client.read_to_end(&mut got);
            if settle {
                read.expect("a settled stream ends cleanly");
                assert_eq!(got, [7; 1000]);
            } else {
                let e = read.expect_err("unread bytes at close reset the peer");
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset);
            }
        }
    }

    fn stream_has_bytes(stream: &Stream) -> bool {
        let mut one = [0u8; 1];
        matches!(stream.socket.peek(&mut one), Ok(1))
    }
}
