//! Reading frames from a ring stream, generic over [`Read`]: one data frame at a time
//! ([`FrameIn`]), the control frames between data frames ([`next_control`]), and a pure look at
//! buffered bytes ([`parse_control`]). Both streams are read the same way: data travels both
//! ways round the ring.
//!
//! Invariants: a header is checked against what the plan expects before a payload byte is read;
//! a control frame's length is bounded by the header decoder and its bytes go to a fixed buffer;
//! nothing here allocates by what a peer claims. Frames are taken in order and every one is
//! looked at: a waiting notice is consumed and reported, never skipped over an abort behind it.
//! Nothing here waits or owns a socket: the caller polls and hands in something to read from,
//! so the tests feed byte slices.

use std::io::{self, Read};

use silvic_core::CollectiveError;

use crate::frame::{Abort, FrameError, HEADER_LEN, Header, Kind, MAX_ABORT_LEN, Waiting};
use crate::ring::seam::Sink;
use crate::wait::nonblocking;

/// A control frame: what a neighbour says besides data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Control {
    /// The neighbour is alive and waiting in collective `seq`, blaming the rank it names.
    Waiting { notice: Waiting, seq: u64 },
    /// The neighbour gave up in collective `seq`, for this reason.
    Abort { seq: u64, error: CollectiveError },
}

fn malformed(peer: usize) -> impl Fn(FrameError) -> CollectiveError {
    move |e| CollectiveError::MalformedFrame { peer, reason: e.to_string() }
}

/// Decodes the payload of a control frame whose header is `header`.
fn control(
    header: &Header,
    payload: &[u8],
    peer: usize,
    world: usize,
) -> Result<Control, CollectiveError> {
    match header.kind {
        Kind::Abort => Ok(Control::Abort {
            seq: header.seq,
            error: Abort::decode(payload, world).map_err(malformed(peer))?.into_error(),
        }),
        Kind::Waiting => Ok(Control::Waiting {
            notice: Waiting::decode(payload, world).map_err(malformed(peer))?,
            seq: header.seq,
        }),
        Kind::Data(_) => unreachable!("called for control frames only"),
    }
}

/// What the front of a byte buffer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Parsed {
    /// Fewer bytes than the frame at the front needs: this many in all.
    Incomplete(usize),
    /// A data frame starts here, with this header.
    Data(Header),
    /// A whole control frame of `len` bytes.
    Control(Control, usize),
}

/// Looks at the frame at the front of `bytes`, from `peer` of a world of `world` ranks.
pub(super) fn parse_control(
    bytes: &[u8],
    peer: usize,
    world: usize,
) -> Result<Parsed, CollectiveError> {
    let Some(head) = bytes.first_chunk::<HEADER_LEN>() else {
        return Ok(Parsed::Incomplete(HEADER_LEN));
    };
    let header = Header::decode(head).map_err(malformed(peer))?;
    if let Kind::Data(_) = header.kind {
        return Ok(Parsed::Data(header));
    }
    // decode() bounds a control frame's length by MAX_ABORT_LEN.
    let len = HEADER_LEN + header.len as usize;
    match bytes.get(HEADER_LEN..len) {
        None => Ok(Parsed::Incomplete(len)),
        Some(payload) => Ok(Parsed::Control(control(&header, payload, peer, world)?, len)),
    }
}

/// What comes next on a stream read between data frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Between {
    /// A whole control frame, consumed.
    Control(Control),
    /// A data frame starts here, with this header; nothing of it is consumed.
    Data(Header),
    /// The stream would block before a whole frame header (and control payload) is in.
    Blocked,
}

/// The next control frame on a stream, read through `ahead` from `src` as needed. A data frame
/// is left where it is; the end of the stream is [`CollectiveError::PeerClosed`].
pub(super) fn next_control<R: Read>(
    ahead: &mut ReadAhead,
    src: &mut R,
    peer: usize,
    world: usize,
) -> Result<Between, CollectiveError> {
    loop {
        let need = match parse_control(ahead.buffered(), peer, world)? {
            Parsed::Data(header) => return Ok(Between::Data(header)),
            Parsed::Control(control, len) => {
                ahead.consume(len);
                return Ok(Between::Control(control));
            }
            Parsed::Incomplete(need) => need,
        };
        match ahead.fill(src, need) {
            Ok(true) => {}
            Ok(false) => return Ok(Between::Blocked),
            Err(e) => return Err(stream_error(peer, &e)),
        }
    }
}

/// Reads one data frame from a neighbour: its header, checked against what the plan expects,
/// then its payload into a sink. Waiting notices before it are taken and reported; an abort
/// fails.
#[derive(Debug)]
pub(super) struct FrameIn {
    head: [u8; HEADER_LEN],
    got: usize,
    state: State,
    control: [u8; MAX_ABORT_LEN],
}

#[derive(Debug, Clone, Copy)]
enum State {
    Header,
    Payload,
    Control(Header),
    Done,
}

impl FrameIn {
    pub(super) fn new() -> Self {
        FrameIn { head: [0; HEADER_LEN], got: 0, state: State::Header, control: [0; MAX_ABORT_LEN] }
    }

    /// Ready for the next frame, as [`FrameIn::new`] (the bytes held are left: nothing reads
    /// them before they are written again).
    pub(super) fn restart(&mut self) {
        (self.got, self.state) = (0, State::Header);
    }

    pub(super) fn done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Whether no part of a frame is held: nothing read yet, or the frame is in.
    pub(super) fn at_boundary(&self) -> bool {
        match self.state {
            State::Header => self.got == 0,
            State::Done => true,
            State::Payload | State::Control(_) => false,
        }
    }

    /// Reads what `src` has, through `ahead`, into the frame. Returns whether the data frame
    /// progressed (its header accepted, or payload bytes in): a waiting notice is no progress,
    /// so a neighbour that only says it waits never looks like one that moves data. A notice
    /// read on the way is put in `heard`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_from<R: Read>(
        &mut self,
        src: &mut R,
        ahead: &mut ReadAhead,
        (peer, world): (usize, usize),
        sink: &mut dyn Sink,
        heard: &mut Option<Waiting>,
    ) -> Result<bool, CollectiveError> {
        let mut moved = false;
        loop {
            let buf: &mut [u8] = match &self.state {
                State::Header => &mut self.head[self.got..],
                State::Payload => sink.space(),
                State::Control(h) => &mut self.control[self.got..h.len as usize],
                State::Done => return Ok(moved),
            };
            if buf.is_empty() {
                moved |= self.advance(peer, world, sink, heard)?;
                continue;
            }
            let n = match nonblocking(|| ahead.read(src, buf)) {
                Ok(Some(0)) => return Err(CollectiveError::PeerClosed { peer }),
                Ok(Some(n)) => n,
                Ok(None) => return Ok(moved),
                Err(e) => return Err(stream_error(peer, &e)),
            };
            match self.state {
                State::Payload => {
                    sink.commit(n);
                    moved = true;
                }
                _ => self.got += n,
            }
        }
    }

    /// Moves past a completed part: checks a header, decodes a control frame, ends a payload.
    /// Returns whether a data header was accepted.
    fn advance(
        &mut self,
        peer: usize,
        world: usize,
        sink: &dyn Sink,
        heard: &mut Option<Waiting>,
    ) -> Result<bool, CollectiveError> {
        self.state = match self.state {
            State::Header => {
                let header = Header::decode(&self.head).map_err(malformed(peer))?;
                self.got = 0;
                match header.kind {
                    Kind::Data(_) => {
                        header.expect(&sink.expected(), peer)?;
                        self.state = State::Payload;
                        return Ok(true);
                    }
                    Kind::Abort | Kind::Waiting => State::Control(header),
                }
            }
            State::Control(header) => {
                let payload = &self.control[..header.len as usize];
                self.got = 0;
                match control(&header, payload, peer, world)? {
                    // A notice of this call, or of an earlier one (the neighbour is behind,
                    // still in it, and this call's frames follow once it is through), says
                    // whom the neighbour waits on; one of a later call says nothing of this one.
                    Control::Waiting { notice, seq } => {
                        if seq <= sink.expected().seq {
                            *heard = Some(notice);
                        }
                        State::Header
                    }
                    Control::Abort { error, .. } => return Err(error),
                }
            }
            State::Payload | State::Done => State::Done,
        };
        Ok(false)
    }
}

/// Bytes read from one stream beyond the frame being parsed: the start of the next one (each
/// stream has its own, since frames come in on both).
///
/// A header is 32 bytes and a small payload a few more; reading them one by one costs a system
/// call each. Reads smaller than the buffer go through it, so one call brings a header and a
/// small payload (and maybe the next frame's start, kept for the next frame). Reads at least as
/// large as the buffer go straight to their destination: a large payload is not copied twice.
#[derive(Debug)]
pub(super) struct ReadAhead {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl ReadAhead {
    /// A read-ahead buffer of `capacity` bytes, at least a header and a control frame.
    pub(super) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(HEADER_LEN + MAX_ABORT_LEN);
        ReadAhead { buf: vec![0; capacity].into_boxed_slice(), start: 0, end: 0 }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// The bytes read ahead, not yet consumed.
    pub(super) fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Drops the first `n` buffered bytes.
    pub(super) fn consume(&mut self, n: usize) {
        self.start += n.min(self.end - self.start);
    }

    /// Fills the front of `dst` from the bytes read ahead, else from `src`. `Ok(0)` only at
    /// the end of the stream, once every byte read ahead is used.
    pub(super) fn read<R: Read>(&mut self, src: &mut R, dst: &mut [u8]) -> io::Result<usize> {
        if self.is_empty() {
            if dst.len() >= self.buf.len() {
                return src.read(dst);
            }
            let n = src.read(&mut self.buf)?;
            (self.start, self.end) = (0, n);
        }
        let n = dst.len().min(self.end - self.start);
        dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }

    /// Reads from `src` until at least `want` bytes (at most the capacity) are buffered.
    /// `Ok(false)` if `src` would block first; the end of the stream is `UnexpectedEof`.
    pub(super) fn fill<R: Read>(&mut self, src: &mut R, want: usize) -> io::Result<bool> {
        let want = want.min(self.buf.len());
        if self.start + want > self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        while self.end - self.start < want {
            match nonblocking(|| src.read(&mut self.buf[self.end..]))? {
                Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Some(n) => self.end += n,
                None => return Ok(false),
            }
        }
        Ok(true)
    }
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
    use std::time::Duration;

    use silvic_core::Op;

    use super::*;
    use crate::frame::MAX_ABORT_LEN;
    use crate::link::tests::VecSink;

    /// A stream that hands out its bytes in chunks of `step`, then would block (or ends).
    struct Trickle {
        bytes: Vec<u8>,
        at: usize,
        step: usize,
        closed: bool,
    }

    impl Trickle {
        fn new(bytes: Vec<u8>, step: usize) -> Self {
            Trickle { bytes, at: 0, step, closed: false }
        }
    }

    impl Read for Trickle {
        fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
            let n = dst.len().min(self.step).min(self.bytes.len() - self.at);
            if n == 0 && !dst.is_empty() {
                return if self.closed { Ok(0) } else { Err(io::ErrorKind::WouldBlock.into()) };
            }
            dst[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn abort_frame(origin: usize, cause: CollectiveError, seq: u64) -> Vec<u8> {
        let mut out = [0u8; HEADER_LEN + MAX_ABORT_LEN];
        let n = Abort { origin, cause }.encode(seq, &mut out);
        out[..n].to_vec()
    }

    fn notice(on: usize) -> Vec<u8> {
        Waiting { on, waited: Duration::from_millis(300) }.encode(4).to_vec()
    }

    #[test]
    fn a_data_frame_arrives_byte_by_byte_after_notices() {
        let expect = Header::data(Op::AllgatherBytes, 4, 5, 5);
        let bytes = [notice(2), notice(3), expect.encode().to_vec(), b"hello".to_vec()].concat();
        for step in [1, 7, 1000] {
            let mut src = Trickle::new(bytes.clone(), step);
            let (mut ahead, mut incoming) = (ReadAhead::new(0), FrameIn::new());
            let mut sink = VecSink(vec![0; 5], 0, expect);
            let mut heard = None;
            let mut turns = 0;
            while !incoming.done() {
                incoming.read_from(&mut src, &mut ahead, (1, 4), &mut sink, &mut heard).unwrap();
                turns += 1;
                assert!(turns < 1000);
            }
            assert_eq!(sink.0, b"hello");
            assert_eq!(heard, Some(Waiting { on: 3, waited: Duration::from_millis(300) }));
        }
    }

    #[test]
    fn notices_alone_are_no_progress() {
        let expect = Header::data(Op::AllgatherBytes, 4, 5, 5);
        let mut src = Trickle::new([notice(2), notice(3)].concat(), 1000);
        let (mut ahead, mut incoming) = (ReadAhead::new(0), FrameIn::new());
        let mut sink = VecSink(vec![0; 5], 0, expect);
        let mut heard = None;
        let moved =
            incoming.read_from(&mut src, &mut ahead, (1, 4), &mut sink, &mut heard).unwrap();
        assert!(!moved, "a notice counted as data progress");
        assert_eq!(heard.map(|w| w.on), Some(3));
        let mut src = Trickle::new(expect.encode().to_vec(), 1000);
        let moved =
            incoming.read_from(&mut src, &mut ahead, (1, 4), &mut sink, &mut heard).unwrap();
        assert!(moved, "an accepted data header is progress");
    }

    #[test]
    fn an_abort_behind_notices_fails_the_read_and_a_wrong_header_is_typed() {
        let expect = Header::data(Op::AllreduceSumF64, 4, 8, 8);
        let cause = CollectiveError::PeerClosed { peer: 3 };
        let bytes = [notice(3), abort_frame(2, cause.clone(), 4)].concat();
        let mut src = Trickle::new(bytes, 5);
        let (mut ahead, mut incoming) = (ReadAhead::new(0), FrameIn::new());
        let mut sink = VecSink(vec![0; 8], 0, expect);
        let mut heard = None;
        let error = loop {
            match incoming.read_from(&mut src, &mut ahead, (1, 4), &mut sink, &mut heard) {
                Ok(_) => continue,
                Err(e) => break e,
            }
        };
        assert_eq!(error, CollectiveError::Aborted { origin: 2, cause: Box::new(cause) });

        let later = Header::data(Op::AllreduceSumF64, 5, 8, 8).encode().to_vec();
        let mut src = Trickle::new(later, 64);
        let mut incoming = FrameIn::new();
        let error =
            incoming.read_from(&mut src, &mut ahead, (1, 4), &mut sink, &mut heard).unwrap_err();
        assert!(matches!(error, CollectiveError::OutOfStep { peer: 1, got_seq: 5, .. }));
        let mut closed = Trickle::new(vec![], 1);
        closed.closed = true;
        let error = FrameIn::new()
            .read_from(&mut closed, &mut ahead, (1, 4), &mut sink, &mut heard)
            .unwrap_err();
        assert_eq!(error, CollectiveError::PeerClosed { peer: 1 });
    }

    #[test]
    fn controls_between_data_frames_come_in_order_and_a_data_frame_is_left_in_place() {
        let cause = CollectiveError::Timeout { peer: 0, waited: Duration::from_secs(2) };
        let data = Header::data(Op::AllgatherBytes, 10, 1, 1).encode().to_vec();
        let bytes = [notice(0), notice(3), abort_frame(2, cause.clone(), 9), data].concat();
        let mut src = Trickle::new(bytes, 3);
        let mut ahead = ReadAhead::new(0);
        let mut seen = Vec::new();
        let mut turns = 0;
        loop {
            match next_control(&mut ahead, &mut src, 2, 4).unwrap() {
                Between::Control(c) => seen.push(c),
                Between::Blocked => {}
                Between::Data(_) => break,
            }
            turns += 1;
            assert!(turns < 1000);
        }
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(matches!(seen[1], Control::Waiting { notice: Waiting { on: 3, .. }, seq: 4 }));
        assert_eq!(
            seen[2],
            Control::Abort {
                seq: 9,
                error: CollectiveError::Aborted { origin: 2, cause: Box::new(cause) }
            }
        );
        // The data frame is still there for the data reader, and stays there.
        let header = Header::data(Op::AllgatherBytes, 10, 1, 1);
        assert_eq!(next_control(&mut ahead, &mut src, 2, 4), Ok(Between::Data(header)));
        let mut sink = VecSink(vec![0; 1], 0, Header::data(Op::AllgatherBytes, 10, 1, 1));
        let mut incoming = FrameIn::new();
        src.bytes.push(b'x');
        while !incoming.done() {
            incoming.read_from(&mut src, &mut ahead, (2, 4), &mut sink, &mut None).unwrap();
        }
        assert_eq!(sink.0, b"x");
        src.closed = true;
        assert_eq!(
            next_control(&mut ahead, &mut src, 2, 4),
            Err(CollectiveError::PeerClosed { peer: 2 })
        );
        // A notice naming a rank outside the world is malformed, not trusted.
        let mut ahead = ReadAhead::new(0);
        let error = next_control(&mut ahead, &mut Trickle::new(notice(4), 64), 2, 4).unwrap_err();
        assert!(matches!(error, CollectiveError::MalformedFrame { peer: 2, .. }), "{error}");
    }

    #[test]
    fn parse_control_looks_without_consuming_and_stops_at_data() {
        let bytes =
            [notice(1), Header::data(Op::AllgatherBytes, 0, 1, 1).encode().to_vec()].concat();
        assert_eq!(parse_control(&bytes[..10], 0, 4), Ok(Parsed::Incomplete(HEADER_LEN)));
        assert_eq!(parse_control(&bytes[..40], 0, 4), Ok(Parsed::Incomplete(44)));
        let Ok(Parsed::Control(Control::Waiting { notice: w, .. }, 44)) =
            parse_control(&bytes, 0, 4)
        else {
            panic!("a notice")
        };
        assert_eq!(w.on, 1);
        let data = Header::data(Op::AllgatherBytes, 0, 1, 1);
        assert_eq!(parse_control(&bytes[44..], 0, 4), Ok(Parsed::Data(data)));
    }

    #[test]
    fn read_ahead_serves_small_reads_fills_and_bypasses_large_ones() {
        let data: Vec<u8> = (0..3 * 1024).map(|i| (i % 251) as u8).collect();
        let mut src = Trickle::new(data.clone(), 100_000);
        let mut ahead = ReadAhead::new(1024);
        let mut got = Vec::new();
        for want in [32, 8, 1, 100, 59] {
            let mut buf = vec![0; want];
            let mut filled = 0;
            while filled < want {
                filled += ahead.read(&mut src, &mut buf[filled..]).unwrap();
            }
            got.extend(buf);
        }
        assert_eq!(got, data[..200]);
        assert!(ahead.fill(&mut src, 40).unwrap());
        assert_eq!(ahead.buffered()[..40], data[200..240]);
        ahead.consume(824);
        assert!(ahead.is_empty());
        // A read as large as the buffer goes straight to its destination.
        let mut big = vec![0u8; 1024];
        assert_eq!(ahead.read(&mut src, &mut big).unwrap(), 1024);
        assert_eq!(big, data[1024..2048]);
        assert!(!ahead.fill(&mut Trickle::new(vec![], 1), 1).unwrap(), "would block");
    }
}
