//! Reading from a ring stream: one frame at a time (header, then payload or abort), through a
//! read-ahead buffer so a header and a small payload take one system call.
//!
//! Invariants: a header is checked against what the step expects before a payload byte is read;
//! an abort's length is bounded by the header decoder, and its bytes go to a fixed buffer;
//! nothing here allocates by what a peer claims, and nothing waits (the caller polls).

use std::io::{self, Read};
use std::net::TcpStream;

use silvic_core::CollectiveError;

use super::READ_AHEAD;
use crate::frame::{Abort, FrameError, HEADER_LEN, Header, Kind, MAX_ABORT_LEN};
use crate::ring::Sink;

/// Reads one frame: a header, then either the expected payload into a sink or an abort.
#[derive(Debug)]
pub(super) struct Incoming {
    head: [u8; HEADER_LEN],
    got: usize,
    state: IncomingState,
    abort: [u8; MAX_ABORT_LEN],
}

#[derive(Debug)]
enum IncomingState {
    Header,
    Payload,
    Abort { len: usize },
    Done,
}

impl Incoming {
    pub(super) fn new() -> Self {
        Incoming {
            head: [0; HEADER_LEN],
            got: 0,
            state: IncomingState::Header,
            abort: [0; MAX_ABORT_LEN],
        }
    }

    pub(super) fn done(&self) -> bool {
        matches!(self.state, IncomingState::Done)
    }

    /// Reads what `stream` has, through `ahead` if given. Returns whether a byte moved. With
    /// `expect` of `None` (the reverse direction) any data frame is malformed.
    pub(super) fn read_from(
        &mut self,
        mut stream: &TcpStream,
        mut ahead: Option<&mut ReadAhead>,
        peer: usize,
        expect: Option<&Header>,
        sink: &mut dyn Sink,
    ) -> Result<bool, CollectiveError> {
        let mut moved = false;
        loop {
            let buf: &mut [u8] = match &mut self.state {
                IncomingState::Header => &mut self.head[self.got..],
                IncomingState::Payload => sink.space(),
                IncomingState::Abort { len } => &mut self.abort[self.got..*len],
                IncomingState::Done => return Ok(moved),
            };
            if buf.is_empty() {
                self.advance(peer, expect)?;
                continue;
            }
            let read = match ahead.as_deref_mut() {
                Some(ahead) => ahead.read(stream, buf),
                None => stream.read(buf),
            };
            let n = match read {
                Ok(0) => return Err(CollectiveError::PeerClosed { peer }),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(stream_error(peer, &e)),
            };
            moved = true;
            match self.state {
                IncomingState::Payload => sink.commit(n),
                _ => self.got += n,
            }
        }
    }

    /// Moves past a completed part: checks a header, decodes an abort, finishes a payload.
    fn advance(&mut self, peer: usize, expect: Option<&Header>) -> Result<(), CollectiveError> {
        let malformed =
            |e: FrameError| CollectiveError::MalformedFrame { peer, reason: e.to_string() };
        self.state = match &self.state {
            IncomingState::Header => {
                let header = Header::decode(&self.head).map_err(malformed)?;
                self.got = 0;
                match (header.kind, expect) {
                    // decode() bounds an abort's length by MAX_ABORT_LEN.
                    (Kind::Abort, _) => IncomingState::Abort { len: header.len as usize },
                    (Kind::Data(_), Some(expected)) => {
                        header.expect(expected, peer)?;
                        IncomingState::Payload
                    }
                    (Kind::Data(_), None) => {
                        return Err(CollectiveError::MalformedFrame {
                            peer,
                            reason: "data frame on the reverse direction".into(),
                        });
                    }
                }
            }
            IncomingState::Abort { len } => {
                return Err(Abort::decode(&self.abort[..*len]).map_err(malformed)?.into_error());
            }
            IncomingState::Payload | IncomingState::Done => IncomingState::Done,
        };
        Ok(())
    }
}

/// Bytes read from the left stream beyond the frame being parsed: the start of the next one.
///
/// A header is 32 bytes and a small payload a few more; reading them one by one costs a system
/// call each. Reads smaller than the buffer go through it, so one call brings a header and a
/// small payload (and maybe the next frame's start, kept for the next step). Reads at least as
/// large as the buffer go straight to their destination: a large payload is not copied twice.
#[derive(Debug)]
pub(super) struct ReadAhead {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl ReadAhead {
    pub(super) fn new() -> Self {
        ReadAhead { buf: vec![0; READ_AHEAD].into_boxed_slice(), start: 0, end: 0 }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Fills the front of `dst` from the bytes read ahead, else from `stream`. `Ok(0)` only at
    /// the end of the stream, once every byte read ahead is used.
    pub(super) fn read(&mut self, mut stream: &TcpStream, dst: &mut [u8]) -> io::Result<usize> {
        if self.is_empty() {
            if dst.len() >= self.buf.len() {
                return stream.read(dst);
            }
            let n = stream.read(&mut self.buf)?;
            (self.start, self.end) = (0, n);
        }
        let n = dst.len().min(self.end - self.start);
        dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }

    /// The next header's bytes without consuming them: what was read ahead, then what
    /// `stream` holds. `None` while fewer than [`HEADER_LEN`] bytes have arrived.
    pub(super) fn peek_header(&self, stream: &TcpStream) -> Option<[u8; HEADER_LEN]> {
        let mut head = [0u8; HEADER_LEN];
        let have = (self.end - self.start).min(HEADER_LEN);
        head[..have].copy_from_slice(&self.buf[self.start..self.start + have]);
        if have < HEADER_LEN {
            let want = HEADER_LEN - have;
            if !matches!(stream.peek(&mut head[have..]), Ok(n) if n == want) {
                return None;
            }
        }
        Some(head)
    }
}

/// A sink for the reverse direction, which carries no payload.
pub(super) struct NoPayload;

impl Sink for NoPayload {
    fn space(&mut self) -> &mut [u8] {
        &mut []
    }
    fn commit(&mut self, _: usize) {}
}

/// A socket error as a collective error: a reset or a broken pipe means the peer is gone.
pub(super) fn stream_error(peer: usize, e: &io::Error) -> CollectiveError {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::UnexpectedEof => CollectiveError::PeerClosed { peer },
        _ => CollectiveError::io(peer, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::Shutdown;
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        (a, b)
    }

    #[test]
    fn read_ahead_keeps_what_a_small_read_brought_for_the_next() {
        let (mut tx, rx) = pair();
        let frames: Vec<u8> = (0..200u8).collect();
        tx.write_all(&frames).unwrap();
        tx.shutdown(Shutdown::Write).unwrap();
        let mut ahead = ReadAhead::new();
        let mut got = Vec::new();
        // Uneven small reads: each is served from what one read took ahead, in order.
        for want in [32, 8, 1, 100, 59] {
            let mut buf = vec![0; want];
            let mut filled = 0;
            while filled < want {
                filled += ahead.read(&rx, &mut buf[filled..]).unwrap();
            }
            got.extend(buf);
        }
        assert_eq!(got, frames);
        assert_eq!(ahead.read(&rx, &mut [0; 4]).unwrap(), 0, "end of stream once all is used");
    }

    /// Reads exactly `dst.len()` bytes through `ahead` from a non-blocking stream.
    fn read_exactly(ahead: &mut ReadAhead, stream: &TcpStream, dst: &mut [u8]) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut got = 0;
        while got < dst.len() {
            match ahead.read(stream, &mut dst[got..]) {
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "bytes never arrived");
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn a_header_is_peeked_across_the_read_ahead_and_the_socket() {
        let (mut tx, rx) = pair();
        rx.set_nonblocking(true).unwrap();
        let bytes: Vec<u8> = (0..40u8).collect();
        tx.write_all(&bytes[..20]).unwrap();
        let mut ahead = ReadAhead::new();
        let mut first = [0u8; 8];
        read_exactly(&mut ahead, &rx, &mut first);
        assert_eq!(first.to_vec(), bytes[..8].to_vec());
        // 12 bytes have come after those 8, some read ahead: not yet a header.
        assert_eq!(ahead.peek_header(&rx), None);
        tx.write_all(&bytes[20..]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let head = loop {
            if let Some(head) = ahead.peek_header(&rx) {
                break head;
            }
            assert!(Instant::now() < deadline, "the rest never arrived");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(head.to_vec(), bytes[8..8 + HEADER_LEN].to_vec());
        // Peeking consumed nothing: the same bytes read back in order.
        let mut rest = [0u8; 32];
        read_exactly(&mut ahead, &rx, &mut rest);
        assert_eq!(rest.to_vec(), bytes[8..].to_vec());
    }

    #[test]
    fn large_reads_bypass_the_read_ahead_once_it_is_empty() {
        let (mut tx, rx) = pair();
        let data: Vec<u8> = (0..3 * READ_AHEAD).map(|i| (i % 251) as u8).collect();
        tx.write_all(&data).unwrap();
        tx.shutdown(Shutdown::Write).unwrap();
        let mut ahead = ReadAhead::new();
        let mut head = [0u8; 10];
        assert_eq!(ahead.read(&rx, &mut head).unwrap(), 10);
        let mut rest = vec![0u8; data.len() - 10];
        let mut filled = 0;
        while filled < rest.len() {
            let n = ahead.read(&rx, &mut rest[filled..]).unwrap();
            assert!(n > 0);
            filled += n;
        }
        assert_eq!([&head[..], &rest[..]].concat(), data);
        assert_eq!(ahead.start, ahead.end, "nothing left behind");
    }
}
