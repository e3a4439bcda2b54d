//! Frames: the fixed header in front of every payload a collective's plan moves, either way
//! round the ring; the abort frame and the waiting notice, the two control frames (their
//! payloads in `control`).
//!
//! ```text
//!  0      2      3      4             8                16               24               32
//!  +------+------+------+-------------+----------------+----------------+----------------+
//!  | "Sn" | kind | way  | block: u32  | seq: u64       | total: u64     | len: u64       |
//!  +------+------+------+-------------+----------------+----------------+----------------+
//!  all integers big-endian; `len` payload bytes follow the header
//!
//!  way: bit 0 the direction, bits 4-5 the path, the other bits zero
//! ```
//!
//! - `kind` is the collective ([`Op`]), [`ABORT`] or [`WAITING`].
//! - `way` holds the way a data frame travels round the ring ([`Dir`]: bit 0, 0 rightward, 1
//!   leftward) and the path its call takes ([`Path`], bits 4 and 5: 0 the gather, 1 the ring,
//!   2 Bruck's, 3 the index), so that ranks that took different paths for one call fail at the
//!   first frame, naming each other, instead of reading one path's bytes as another's. `block`
//!   is whose data a data frame carries (the rank of a gathered block, or the segment a frame
//!   of the ring path carries). `way` and `block` are zero in a control frame.
//! - `seq` is the collective's index since connect: the same on every rank for the same call.
//! - `total` is the caller's buffer length in bytes, so ranks that passed different lengths fail
//!   at the first frame even when a segment happens to be the same size as a whole buffer.
//! - `len` is the payload length. It is compared with what the receiver expects and never used to
//!   size an allocation.
//!
//! Invariants: [`Header::decode`] takes exactly [`HEADER_LEN`] bytes (a short header cannot
//! exist), rejects an unknown kind, a `way` byte with a reserved bit set, a control frame with
//! a direction, path or block and any length above [`MAX_LEN`], and `decode(encode(h)) == h`.
//! Nothing here does I/O.
//!
//! Payload numbers are little-endian: the ring sends a buffer's memory as it is, so the crate
//! refuses to build for big-endian targets rather than mix byte orders on the wire.

use byteorder::{BigEndian, ByteOrder};

use silvic_core::{CollectiveError, Dtype, Op, Reduction};

mod control;

#[cfg_attr(not(feature = "fuzzing"), expect(unused_imports, reason = "for fuzz/ alone"))]
pub use control::escape_controls;
pub use control::{Abort, Waiting};

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 32;
/// The two bytes every frame starts with.
pub const FRAME_MAGIC: [u8; 2] = *b"Sn";
/// The kind byte of an abort frame.
pub const ABORT: u8 = 0xAB;
/// The largest payload length a header may claim: 256 TiB, far above any buffer.
pub const MAX_LEN: u64 = 1 << 48;
/// The kind byte of a waiting notice.
pub const WAITING: u8 = 0xA7;
/// Bytes in a waiting notice's payload.
pub const WAITING_LEN: usize = 4 + 8;
/// Bytes in an abort payload, before its message.
pub const ABORT_FIXED_LEN: usize = 4 + 1 + 4 + 1 + 1 + 8 + 8 + 2;
/// The longest message an abort payload carries; longer messages are cut.
pub const MAX_ABORT_MESSAGE: usize = 480;
/// The largest abort payload.
pub const MAX_ABORT_LEN: usize = ABORT_FIXED_LEN + MAX_ABORT_MESSAGE;

/// Which way a data frame travels round the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// From a rank to its right neighbour, `r + 1`.
    Right,
    /// From a rank to its left neighbour, `r - 1`.
    Left,
}

/// The path a data frame's call takes: an allreduce's path, or the plan another collective is
/// made of (an allgather takes the gather or Bruck's; the record reduce-scatter and allreduce
/// the ring). Every frame of one call names the same path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The two-way allgather of whole blocks round the ring (a control frame's, too).
    Gather,
    /// The reduce-scatter and gather of slices round the ring.
    Ring,
    /// Bruck's allgather over chord streams.
    Bruck,
    /// Index-fold-gather over chord streams.
    Index,
}

/// The bits of the `way` byte that hold the path.
const PATH_SHIFT: u8 = 4;
/// The bits of the `way` byte in use: the direction and the path.
const WAY_BITS: u8 = 0x01 | (0x03 << PATH_SHIFT);

impl Path {
    fn to_bits(self) -> u8 {
        let code = match self {
            Path::Gather => 0,
            Path::Ring => 1,
            Path::Bruck => 2,
            Path::Index => 3,
        };
        code << PATH_SHIFT
    }

    fn from_way(way: u8) -> Path {
        match (way >> PATH_SHIFT) & 0x03 {
            0 => Path::Gather,
            1 => Path::Ring,
            2 => Path::Bruck,
            _ => Path::Index,
        }
    }
}

/// What a frame carries: a collective's data or an abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Data of a collective.
    Data(Op),
    /// The sender failed; the payload says where and why.
    Abort,
    /// The sender is alive and waiting on another rank; the payload says which.
    Waiting,
}

/// The first kind byte of the typed allreduces: `TYPED + 8 × reduction + dtype`, in the order
/// of [`Reduction::ALL`] and [`Dtype::ALL`] (the three pinned ones keep bytes 1 to 3).
const TYPED: u8 = 0x10;

impl Kind {
    fn to_byte(self) -> u8 {
        match self {
            Kind::Data(Op::AllreduceSumF64) => 1,
            Kind::Data(Op::AllreduceSumI64) => 2,
            Kind::Data(Op::AllreduceMaxF64) => 3,
            Kind::Data(Op::AllgatherBytes) => 4,
            Kind::Data(Op::ReduceScatterRecords) => 5,
            Kind::Data(Op::AllreduceRecords) => 6,
            Kind::Data(Op::AllgatherVarlen) => 7,
            Kind::Data(Op::BroadcastBytes) => 8,
            Kind::Data(Op::AllgatherBlocks) => 9,
            Kind::Data(Op::Allreduce { reduction, dtype }) => {
                TYPED + 8 * reduction as u8 + dtype as u8
            }
            Kind::Data(_) => unreachable!("every Op has a kind byte"),
            Kind::Abort => ABORT,
            Kind::Waiting => WAITING,
        }
    }

    fn from_byte(byte: u8) -> Option<Kind> {
        Some(match byte {
            1 => Kind::Data(Op::AllreduceSumF64),
            2 => Kind::Data(Op::AllreduceSumI64),
            3 => Kind::Data(Op::AllreduceMaxF64),
            4 => Kind::Data(Op::AllgatherBytes),
            5 => Kind::Data(Op::ReduceScatterRecords),
            6 => Kind::Data(Op::AllreduceRecords),
            7 => Kind::Data(Op::AllgatherVarlen),
            8 => Kind::Data(Op::BroadcastBytes),
            9 => Kind::Data(Op::AllgatherBlocks),
            ABORT => Kind::Abort,
            WAITING => Kind::Waiting,
            _ => {
                let at = byte.checked_sub(TYPED)?;
                let reduction = *Reduction::ALL.get(usize::from(at / 8))?;
                let dtype = *Dtype::ALL.get(usize::from(at % 8))?;
                let kind = Kind::Data(Op::allreduce(reduction, dtype));
                // The pinned three have their own bytes; their typed spelling is not a kind.
                return (kind.to_byte() == byte).then_some(kind);
            }
        })
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame carries.
    pub kind: Kind,
    /// Which way the frame travels (a control frame: [`Dir::Right`]).
    pub dir: Dir,
    /// The path the frame's call takes (a control frame: [`Path::Gather`]).
    pub path: Path,
    /// Whose block (or which segment) the frame carries (a control frame: 0).
    pub block: u32,
    /// The collective's index since connect.
    pub seq: u64,
    /// The caller's buffer length in bytes (for an abort: 0).
    pub total: u64,
    /// Payload bytes after the header.
    pub len: u64,
}

/// Why bytes are not a frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first two bytes are not [`FRAME_MAGIC`].
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 2]),
    /// The kind byte names no collective.
    #[error("unknown kind {0:#04x}")]
    UnknownKind(u8),
    /// The `way` byte has a reserved bit set, or a control frame has a direction, path or block.
    #[error("reserved bytes are not zero")]
    Reserved,
    /// The payload length is above [`MAX_LEN`], or an abort payload above [`MAX_ABORT_LEN`].
    #[error("payload length {0} is too large")]
    TooLong(u64),
    /// An abort payload is cut short, its fields disagree with its length, or a field its
    /// cause does not use is not zero.
    #[error("abort payload is malformed")]
    BadAbort,
    /// A waiting notice's payload is not [`WAITING_LEN`] bytes.
    #[error("waiting notice is malformed")]
    BadWaiting,
    /// A rank field names no rank of this world.
    #[error("rank {0} is not in this world")]
    BadRank(u32),
}

impl Header {
    /// The header of a data frame of the gather path travelling rightward with block 0 (see
    /// [`Header::carrying`] and [`Header::on`]).
    pub fn data(op: Op, seq: u64, total: u64, len: u64) -> Header {
        let (dir, path) = (Dir::Right, Path::Gather);
        Header { kind: Kind::Data(op), dir, path, block: 0, seq, total, len }
    }

    /// The header of a control frame.
    pub fn control(kind: Kind, seq: u64, len: u64) -> Header {
        Header { kind, dir: Dir::Right, path: Path::Gather, block: 0, seq, total: 0, len }
    }

    /// This header, of a call on `path`.
    pub fn on(self, path: Path) -> Header {
        Header { path, ..self }
    }

    /// This header, travelling `dir` and carrying `block`.
    pub fn carrying(self, dir: Dir, block: usize) -> Header {
        Header { dir, block: u32::try_from(block).unwrap_or(u32::MAX), ..self }
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..2].copy_from_slice(&FRAME_MAGIC);
        out[2] = self.kind.to_byte();
        let dir = match self.dir {
            Dir::Right => 0,
            Dir::Left => 1,
        };
        out[3] = dir | self.path.to_bits();
        BigEndian::write_u32(&mut out[4..8], self.block);
        BigEndian::write_u64(&mut out[8..16], self.seq);
        BigEndian::write_u64(&mut out[16..24], self.total);
        BigEndian::write_u64(&mut out[24..32], self.len);
        out
    }

    /// Decodes a header, checking everything that does not depend on what the receiver expects.
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        if bytes[..2] != FRAME_MAGIC {
            return Err(FrameError::BadMagic([bytes[0], bytes[1]]));
        }
        let kind = Kind::from_byte(bytes[2]).ok_or(FrameError::UnknownKind(bytes[2]))?;
        let way = bytes[3];
        if way & !WAY_BITS != 0 {
            return Err(FrameError::Reserved);
        }
        let dir = if way & 1 == 0 { Dir::Right } else { Dir::Left };
        let path = Path::from_way(way);
        let block = BigEndian::read_u32(&bytes[4..8]);
        if !matches!(kind, Kind::Data(_)) && (way, block) != (0, 0) {
            return Err(FrameError::Reserved);
        }
        let len = BigEndian::read_u64(&bytes[24..32]);
        let max = match kind {
            Kind::Abort => MAX_ABORT_LEN as u64,
            Kind::Waiting => WAITING_LEN as u64,
            Kind::Data(_) => MAX_LEN,
        };
        if len > max {
            return Err(FrameError::TooLong(len));
        }
        let seq = BigEndian::read_u64(&bytes[8..16]);
        let total = BigEndian::read_u64(&bytes[16..24]);
        Ok(Header { kind, dir, path, block, seq, total, len })
    }

    /// Checks a data header from `peer` against the one this rank expects at this point of the
    /// collective: same op and sequence (else out of step), same buffer length (else a length
    /// mismatch), same path, direction, block and payload length (else malformed). Called
    /// before a payload byte is read.
    pub fn expect(&self, expected: &Header, peer: usize) -> Result<(), CollectiveError> {
        let (Kind::Data(got_op), Kind::Data(expected_op)) = (self.kind, expected.kind) else {
            return Err(CollectiveError::MalformedFrame {
                peer,
                reason: "expected a data frame".into(),
            });
        };
        if got_op != expected_op || self.seq != expected.seq {
            return Err(CollectiveError::OutOfStep {
                peer,
                expected_op,
                expected_seq: expected.seq,
                got_op,
                got_seq: self.seq,
            });
        }
        if self.total != expected.total {
            return Err(CollectiveError::LengthMismatch {
                peer,
                expected: expected.total,
                got: self.total,
            });
        }
        if self.path != expected.path {
            return Err(self.on_another_path(expected.path, peer));
        }
        if (self.dir, self.block) != (expected.dir, expected.block) {
            return Err(CollectiveError::MalformedFrame {
                peer,
                reason: format!(
                    "block {} travelling {:?}, expected block {} travelling {:?}",
                    self.block, self.dir, expected.block, expected.dir
                ),
            });
        }
        if self.len != expected.len {
            return Err(CollectiveError::MalformedFrame {
                peer,
                reason: format!("payload of {} bytes, expected {}", self.len, expected.len),
            });
        }
        Ok(())
    }
}

impl Header {
    /// The error for this data frame from `peer`, of a call this rank takes on `path`: the two
    /// ranks chose different paths for one call (one forced a path the other did not).
    pub fn on_another_path(&self, path: Path, peer: usize) -> CollectiveError {
        CollectiveError::MalformedFrame {
            peer,
            reason: format!(
                "call #{}: a frame of the {} path at a rank on the {} path \
                 (the ranks disagree on the allreduce path)",
                self.seq,
                self.path.name(),
                path.name()
            ),
        }
    }
}

impl Path {
    /// The path's name, as `SILVIC_ALLREDUCE` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Path::Gather => "gather",
            Path::Ring => "ring",
            Path::Bruck => "bruck",
            Path::Index => "index",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const PATHS: [Path; 4] = [Path::Gather, Path::Ring, Path::Bruck, Path::Index];

    #[test]
    fn the_way_byte_holds_the_direction_and_the_path() {
        let head = Header::data(Op::AllreduceSumF64, 1, 8, 8);
        let bytes: Vec<u8> =
            PATHS.iter().map(|&p| head.carrying(Dir::Left, 0).on(p).encode()[3]).collect();
        assert_eq!(bytes, [0x01, 0x11, 0x21, 0x31]);
        assert_eq!(head.on(Path::Ring).encode()[3], 0x10);
    }

    fn all_kinds() -> Vec<Kind> {
        let mut kinds = vec![Kind::Abort];
        for op in [
            Op::AllgatherBytes,
            Op::ReduceScatterRecords,
            Op::AllreduceRecords,
            Op::AllgatherVarlen,
            Op::BroadcastBytes,
            Op::AllgatherBlocks,
        ] {
            kinds.push(Kind::Data(op));
        }
        for reduction in Reduction::ALL {
            for dtype in Dtype::ALL {
                kinds.push(Kind::Data(Op::allreduce(reduction, dtype)));
            }
        }
        kinds
    }

    /// Every kind has its own byte, and every byte is one kind or none: the typed spelling of a
    /// pinned allreduce (`TYPED + 8 × sum + f64`) is refused.
    #[test]
    fn kind_bytes_are_one_to_one() {
        let kinds = all_kinds();
        let mut bytes: Vec<u8> = kinds.iter().map(|k| k.to_byte()).collect();
        bytes.sort_unstable();
        bytes.dedup();
        assert_eq!(bytes.len(), kinds.len());
        let decoded = (0..=255u8).filter_map(Kind::from_byte).count();
        assert_eq!(decoded, kinds.len() + 1, "every kind and the waiting notice");
        for byte in 0..=255u8 {
            if let Some(kind) = Kind::from_byte(byte) {
                assert_eq!(kind.to_byte(), byte);
            }
        }
        assert_eq!(Kind::from_byte(TYPED + 1), None, "sum of f64 is byte 1");
    }

    #[test]
    fn header_round_trips() {
        for kind in all_kinds() {
            for (seq, total, len) in [(0, 0, 0), (1, 4096, 480), (u64::MAX, u64::MAX, 400)] {
                let h = Header::control(kind, seq, len);
                let h = Header { total, ..h };
                if let Kind::Data(_) = kind {
                    for (dir, block) in [(Dir::Left, 0), (Dir::Right, 7), (Dir::Left, 65_537)] {
                        for path in PATHS {
                            let h = h.carrying(dir, block).on(path);
                            assert_eq!(Header::decode(&h.encode()), Ok(h));
                        }
                    }
                } else {
                    assert_eq!(Header::decode(&h.encode()), Ok(h));
                }
            }
        }
        let big = Header::data(Op::AllgatherBytes, 9, MAX_LEN, MAX_LEN);
        assert_eq!(Header::decode(&big.encode()), Ok(big));
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let good = Header::data(Op::AllreduceSumF64, 3, 64, 64).encode();
        let mut bad = good;
        bad[0] = b'X';
        assert_eq!(Header::decode(&bad), Err(FrameError::BadMagic([b'X', b'n'])));
        let mut bad = good;
        bad[2] = 0x77;
        assert_eq!(Header::decode(&bad), Err(FrameError::UnknownKind(0x77)));
        for way in [2, 4, 8, 0x40, 0x80, 0x31 | 0x02] {
            let mut bad = good;
            bad[3] = way;
            assert_eq!(Header::decode(&bad), Err(FrameError::Reserved), "way byte {way:#04x}");
        }
        let notice = Waiting { on: 1, waited: Duration::ZERO }.encode(3);
        for (at, byte) in [(3, 1), (3, 0x10), (3, 0x30), (7, 1), (4, 0x80)] {
            let mut bad: [u8; HEADER_LEN] = notice[..HEADER_LEN].try_into().unwrap();
            bad[at] = byte;
            assert_eq!(Header::decode(&bad), Err(FrameError::Reserved), "control byte {at}");
        }
        let mut bad = good;
        bad[24..32].copy_from_slice(&(MAX_LEN + 1).to_be_bytes());
        assert_eq!(Header::decode(&bad), Err(FrameError::TooLong(MAX_LEN + 1)));
        let mut bad = Header::control(Kind::Abort, 0, 0).encode();
        bad[24..32].copy_from_slice(&((MAX_ABORT_LEN + 1) as u64).to_be_bytes());
        assert!(matches!(Header::decode(&bad), Err(FrameError::TooLong(_))));
        assert_eq!(Header::decode(&[0u8; HEADER_LEN]), Err(FrameError::BadMagic([0, 0])));
    }

    #[test]
    fn expect_names_both_sides() {
        let mine = Header::data(Op::AllreduceSumF64, 5, 800, 200);
        let theirs = Header::data(Op::AllgatherBytes, 5, 800, 200);
        assert!(matches!(
            theirs.expect(&mine, 2),
            Err(CollectiveError::OutOfStep { peer: 2, got_op: Op::AllgatherBytes, .. })
        ));
        let later = Header::data(Op::AllreduceSumF64, 6, 800, 200);
        assert!(matches!(
            later.expect(&mine, 2),
            Err(CollectiveError::OutOfStep { expected_seq: 5, got_seq: 6, .. })
        ));
        let longer = Header::data(Op::AllreduceSumF64, 5, 808, 200);
        assert_eq!(
            longer.expect(&mine, 1),
            Err(CollectiveError::LengthMismatch { peer: 1, expected: 800, got: 808 })
        );
        assert_eq!(mine.expect(&mine, 0), Ok(()));
        let error = mine.on(Path::Index).expect(&mine, 3).unwrap_err();
        let CollectiveError::MalformedFrame { peer: 3, reason } = &error else { panic!("{error}") };
        assert!(reason.contains("index path at a rank on the gather path"), "{reason}");
        let mine = mine.carrying(Dir::Left, 3);
        for theirs in [mine.carrying(Dir::Right, 3), mine.carrying(Dir::Left, 2)] {
            let error = theirs.expect(&mine, 4).unwrap_err();
            assert!(matches!(error, CollectiveError::MalformedFrame { peer: 4, .. }), "{error}");
        }
    }
}
