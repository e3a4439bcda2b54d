//! Writes the seed corpora under `fuzz/corpus/<target>/`: valid frames, aborts and handshake
//! messages built with silvic-net's own encoders, plus a few near misses, so every target starts
//! from inputs that reach past the first check.
//!
//! Run from anywhere: `cargo run --manifest-path fuzz/Cargo.toml --example write_seeds`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use silvic_net::frame::{
    Abort, Dir, HEADER_LEN, Header, Kind, MAX_ABORT_LEN, MAX_LEN, Path as Plan, Waiting,
};
use silvic_net::handshake::{Acceptor, Connector, Message, MessageKind, Next, VERSION};
use silvic_net::{CollectiveError, Dtype, Op, Reduction};
use silvic_net_fuzz::REASONS;

const OPS: [Op; 11] = [
    Op::AllreduceSumF64,
    Op::AllreduceSumI64,
    Op::AllreduceMaxF64,
    Op::AllgatherBytes,
    Op::ReduceScatterRecords,
    Op::AllreduceRecords,
    Op::AllgatherVarlen,
    Op::BroadcastBytes,
    Op::AllgatherBlocks,
    Op::Allreduce { reduction: Reduction::Min, dtype: Dtype::F32 },
    Op::Allreduce { reduction: Reduction::Sum, dtype: Dtype::I128 },
];

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus");

    let frames = root.join("frame_decode");
    for (i, op) in OPS.into_iter().enumerate() {
        let h = Header::data(op, i as u64, 4096, 1024).encode();
        write(&frames, &format!("data-{i}"), &h);
        write(&frames, &format!("data-{i}-expected"), &[h, h].concat());
        let other = Header::data(op, i as u64 + 1, 4096, 1024).encode();
        write(&frames, &format!("data-{i}-out-of-step"), &[&h[..], &other, &[3]].concat());
        let left = Header::data(op, i as u64, 4096, 1024).carrying(Dir::Left, i + 1).encode();
        write(&frames, &format!("data-{i}-leftward"), &[left, left].concat());
        write(&frames, &format!("data-{i}-other-way"), &[&h[..], &left, &[2]].concat());
    }
    // Every path in the way byte, and a frame of one path where another is expected.
    for (i, plan) in [Plan::Gather, Plan::Ring, Plan::Bruck, Plan::Index].into_iter().enumerate() {
        let h = Header::data(Op::AllreduceSumF64, 5, 800, 200).carrying(Dir::Left, 3).on(plan);
        write(&frames, &format!("path-{i}-expected"), &[h.encode(), h.encode()].concat());
        let other = h.on(Plan::Ring).encode();
        write(
            &frames,
            &format!("path-{i}-against-ring"),
            &[&h.encode()[..], &other, &[4]].concat(),
        );
    }
    let big = Header::data(Op::AllgatherBytes, u64::MAX, MAX_LEN, MAX_LEN).encode();
    write(&frames, "data-max-len", &big);
    let abort = Header::control(Kind::Abort, 9, MAX_ABORT_LEN as u64);
    write(&frames, "abort-max-len", &abort.encode());
    let mut too_long = big;
    too_long[24..].copy_from_slice(&(MAX_LEN + 1).to_be_bytes());
    write(&frames, "data-too-long", &too_long);
    write(&frames, "zeros", &[0; HEADER_LEN]);

    let aborts = root.join("abort_decode");
    let causes = [
        CollectiveError::Io {
            peer: 1,
            kind: std::io::ErrorKind::ConnectionReset,
            message: "connection reset by peer (os error 104)".into(),
        },
        CollectiveError::PeerClosed { peer: 2 },
        CollectiveError::Timeout { peer: 3, waited: Duration::from_secs(60) },
        CollectiveError::OutOfStep {
            peer: 0,
            expected_op: Op::AllreduceSumF64,
            expected_seq: 7,
            got_op: Op::AllgatherBytes,
            got_seq: 8,
        },
        CollectiveError::LengthMismatch { peer: 1, expected: 4096, got: 8192 },
        CollectiveError::MalformedFrame { peer: 2, reason: "bad magic [00, 00]".into() },
        CollectiveError::MalformedFrame { peer: 2, reason: "é".repeat(300) },
        // Names no peer: only the origin is checked against the world.
        CollectiveError::InvalidArgument { reason: "root 9 is not a rank".into() },
        CollectiveError::Cancelled,
    ];
    for (i, cause) in causes.iter().enumerate() {
        let mut frame = [0u8; HEADER_LEN + MAX_ABORT_LEN];
        let n = Abort { origin: 3, cause: cause.clone() }.encode(5, &mut frame);
        write(&aborts, &format!("payload-{i}"), &[&[0u8][..], &frame[HEADER_LEN..n]].concat());
    }
    // Control characters in a cause, and a waiting notice's payload.
    let garbled =
        CollectiveError::MalformedFrame { peer: 1, reason: "a\nforged\u{1b}[2J\0".into() };
    let mut frame = [0u8; HEADER_LEN + MAX_ABORT_LEN];
    let n = Abort { origin: 0, cause: garbled }.encode(5, &mut frame);
    write(&aborts, "payload-control-characters", &[&[0u8][..], &frame[HEADER_LEN..n]].concat());
    let notice = Waiting { on: 2, waited: Duration::from_millis(1500) }.encode(5);
    write(&aborts, "waiting-notice", &[&[0u8][..], &notice[HEADER_LEN..]].concat());
    write(&frames, "waiting", &notice[..HEADER_LEN]);
    // Structured mode (odd first byte): the bytes pick an error to send.
    for i in 0..8u8 {
        write(&aborts, &format!("error-{i}"), &[1, 0, 0, 0, 0, i, 0xff, 0xff, 0xff, 0xff, 0xff]);
    }

    let messages = root.join("handshake_decode");
    let token = b"job-token";
    let roster = [0x33; 32];
    let (mut connector, hello) = Connector::start(token, roster, 4, 1, 2, [0x11; 16]);
    let mut acceptor = Acceptor::new(token, roster, 4, 2, 1, [0x22; 16]);
    let Next::Send(challenge) = acceptor.on_message(&hello) else { unreachable!() };
    let Next::Send(proof) = connector.on_message(&challenge) else { unreachable!() };
    let Next::SendAndDone(welcome) = acceptor.on_message(&proof) else { unreachable!() };
    for (name, m) in
        [("hello", hello), ("challenge", challenge), ("proof", proof), ("welcome", welcome)]
    {
        write(&messages, name, &m.encode());
    }
    for (i, reason) in REASONS.into_iter().enumerate() {
        let m = Message {
            version: 0,
            kind: MessageKind::Reject(reason),
            world: 0,
            rank: 0,
            nonce: [0; 16],
            mac: [0; 32],
            channel: 0,
        };
        write(&messages, &format!("reject-{i}"), &m.encode());
    }
    let other_version = Message { version: VERSION + 1, ..hello };
    write(&messages, "hello-other-version", &other_version.encode());
    let other_channel = Message { channel: 3, ..hello };
    write(&messages, "hello-channel-3", &other_channel.encode());

    let roles = root.join("handshake_roles");
    // All-zero choices are the honest exchange; the later bytes steer picks towards replays,
    // wrong tokens, flips and arbitrary messages.
    write(&roles, "honest", &[]);
    write(&roles, "honest-world-4", &[3, b'j', b'o', b'b', 0, 0, 0, 0, 2, 0, 0, 0, 1]);
    // The acceptor of a set (a ring with chords): these bytes draw world 10, connector 0
    // (acceptor 1) and the set {0, 5, 6} (found by a search over inputs, since lengths are
    // taken from the end of the input); the honest exchange follows.
    let mut bytes = vec![8u8, 6, 0, 0, 0, 8, 0, 5, 7, 8, 7, 3];
    bytes.extend([0; 58]);
    bytes.extend([1, 5, 7, 5, 1, 6, 6, 7, 0, 0]);
    write(&roles, "from-a-set", &bytes);
    for pick in 4..8u8 {
        let mut bytes = vec![0u8; 48];
        bytes.extend([0, pick, 7, 0, pick, 9, pick, 0, 0, pick, 3]);
        write(&roles, &format!("picks-{pick}"), &bytes);
    }
    let ring = root.join("ring_frames");
    // [call, len as u16 LE, what rank 1 sends]: the honest frame of each call, an abort, and
    // near misses (another sequence, a short payload, another block or direction). In a world
    // of two the small path's gather is one rightward hop: rank 1 sends its own block, 1.
    let data = |op, seq, total, len| Header::data(op, seq, total, len).carrying(Dir::Right, 1);
    for (selector, op) in
        [(0u8, Op::AllreduceSumF64), (1, Op::AllreduceSumI64), (2, Op::AllreduceMaxF64)]
    {
        for len in [0u16, 1, 5, 100] {
            let bytes = u64::from(len) * 8;
            let mut input = vec![selector, len as u8, (len >> 8) as u8];
            input.extend(data(op, 0, bytes, bytes).encode());
            input.extend((0..bytes).map(|i| (i * 37) as u8));
            write(&ring, &format!("{op:?}-{len}"), &input);
        }
    }
    for len in [0u16, 3, 600] {
        let mut input = vec![3u8, len as u8, (len >> 8) as u8];
        input.extend(data(Op::AllgatherBytes, 0, len.into(), len.into()).encode());
        input.extend((0..len).map(|i| i as u8 ^ 0x5a));
        write(&ring, &format!("gather-{len}"), &input);
    }
    let mut input = vec![0u8, 4, 0];
    input.extend(data(Op::AllreduceSumF64, 1, 32, 32).encode());
    write(&ring, "another-sequence", &input);
    // The honest gather frame, but of a call that took another path on rank 1.
    for plan in [Plan::Ring, Plan::Bruck, Plan::Index] {
        let mut input = vec![0u8, 4, 0];
        input.extend(data(Op::AllreduceSumF64, 0, 32, 32).on(plan).encode());
        input.extend([1; 32]);
        write(&ring, &format!("another-path-{}", plan.name()), &input);
    }
    let mut input = vec![0u8, 4, 0];
    input.extend(data(Op::AllreduceSumF64, 0, 32, 32).encode());
    input.extend([1; 20]);
    write(&ring, "short-payload", &input);
    for (name, dir, block) in [("another-block", Dir::Right, 0), ("leftward", Dir::Left, 1)] {
        let mut input = vec![3u8, 3, 0];
        input.extend(Header::data(Op::AllgatherBytes, 0, 3, 3).carrying(dir, block).encode());
        input.extend([7, 8, 9]);
        write(&ring, name, &input);
    }
    let mut frame = [0u8; HEADER_LEN + MAX_ABORT_LEN];
    let timeout = CollectiveError::Timeout { peer: 0, waited: Duration::from_secs(60) };
    let n = Abort { origin: 1, cause: timeout }.encode(0, &mut frame);
    write(&ring, "abort", &[&[0u8, 4, 0][..], &frame[..n]].concat());
    let n = Abort { origin: 1, cause: causes[2].clone() }.encode(0, &mut frame);
    write(&ring, "abort-rank-outside-the-world", &[&[0u8, 4, 0][..], &frame[..n]].concat());
    // Waiting notices before the data frame, and before an abort.
    let notice = Waiting { on: 0, waited: Duration::from_millis(750) }.encode(0);
    let mut input = vec![3u8, 3, 0];
    input.extend(notice);
    input.extend(notice);
    input.extend(data(Op::AllgatherBytes, 0, 3, 3).encode());
    input.extend([7, 8, 9]);
    write(&ring, "notices-then-gather", &input);
    let n = Abort { origin: 1, cause: causes[1].clone() }.encode(0, &mut frame);
    let input = [&[0u8, 4, 0][..], &notice, &frame[..n]].concat();
    write(&ring, "notice-then-abort", &input);

    // A world of three (selector bit 2): `[selector, len, split as u16 LE, left, right]`. Rank
    // 0's left neighbour is rank 2, whose frames travel rightward, and its right neighbour rank
    // 1, whose frames travel leftward. Bit 3 forces the ring path: segments 2 then 1 come in to
    // be folded, then segment 0 rightward and segment 2 leftward, gathered.
    let world3 = |selector: u8, len: u16, left: Vec<u8>, right: Vec<u8>| {
        let split = left.len() as u16;
        let head = vec![selector, len as u8, (len >> 8) as u8, split as u8, (split >> 8) as u8];
        [head, left, right].concat()
    };
    let frame_on = |plan, op, total: u64, dir, block, payload: Vec<u8>| {
        let head = Header::data(op, 0, total, payload.len() as u64).carrying(dir, block);
        [head.on(plan).encode().to_vec(), payload].concat()
    };
    let frame =
        |op, total, dir, block, payload| frame_on(Plan::Gather, op, total, dir, block, payload);
    let ring_frame =
        |op, total, dir, block, payload| frame_on(Plan::Ring, op, total, dir, block, payload);
    let bytes = |n: usize, salt: u8| -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ salt).collect()
    };
    for (selector, op) in
        [(0u8, Op::AllreduceSumF64), (1, Op::AllreduceSumI64), (2, Op::AllreduceMaxF64)]
    {
        for len in [1u16, 5, 100] {
            let total = u64::from(len) * 8;
            let left = frame(op, total, Dir::Right, 2, bytes(total as usize, 1));
            let right = frame(op, total, Dir::Left, 1, bytes(total as usize, 2));
            write(&ring, &format!("world3-{op:?}-{len}"), &world3(selector | 4, len, left, right));
            let seg = |j: usize| (usize::from(len) / 3 + usize::from(j < usize::from(len) % 3)) * 8;
            let left = [
                ring_frame(op, total, Dir::Right, 2, bytes(seg(2), 3)),
                ring_frame(op, total, Dir::Right, 1, bytes(seg(1), 4)),
                ring_frame(op, total, Dir::Right, 0, bytes(seg(0), 5)),
            ]
            .concat();
            let right = ring_frame(op, total, Dir::Left, 2, bytes(seg(2), 6));
            let input = world3(selector | 12, len, left, right);
            write(&ring, &format!("world3-ring-{op:?}-{len}"), &input);
        }
    }
    for len in [0u16, 3, 600] {
        let n = usize::from(len);
        let left = frame(Op::AllgatherBytes, len.into(), Dir::Right, 2, bytes(n, 7));
        let right = frame(Op::AllgatherBytes, len.into(), Dir::Left, 1, bytes(n, 8));
        write(&ring, &format!("world3-gather-{len}"), &world3(3 | 4, len, left, right));
    }

    // Larger worlds and the log-depth paths (`len_hi` bits 2 to 6): `[selector, len, len_hi,
    // splits as u16 LE, streams...]`, rank 0's streams from ranks 3, 1 and 2 at world four (the
    // left neighbour's, the right one's, the chord's), 4, 1, 3 and 2 at world five. Bruck's
    // round 0 brings rank 1's own block, round 1 blocks 2 and 3 from rank 2; the index's first
    // frame from rank 1 carries its slot 1, its contribution to segment 0; the gather forced or
    // chosen at long hops start from their first hops.
    let streams_input = |selector: u8, len: u16, high: u8, streams: Vec<Vec<u8>>| {
        let mut input = vec![selector, len as u8, (len >> 8) as u8 | high];
        for stream in &streams[..streams.len() - 1] {
            input.extend((stream.len() as u16).to_le_bytes());
        }
        input.extend(streams.concat());
        input
    };
    for len in [1u16, 5, 100] {
        let (op, total) = (Op::AllreduceSumF64, u64::from(len) * 8);
        let n = usize::from(len) * 8;
        let bruck = |block| frame_on(Plan::Bruck, op, total, Dir::Right, block, bytes(n, 12));
        let input = streams_input(
            0,
            len,
            3 << 2 | 1 << 5,
            vec![vec![], bruck(1), [bruck(2), bruck(3)].concat()],
        );
        write(&ring, &format!("world4-bruck-{len}"), &input);
        let seg = (usize::from(len) / 4 + usize::from(usize::from(len) % 4 > 0)) * 8;
        let index = frame_on(Plan::Index, op, total, Dir::Right, 1, bytes(seg, 13));
        let input = streams_input(0, len, 4 << 2 | 1 << 5, vec![vec![], index, vec![]]);
        write(&ring, &format!("world4-index-{len}"), &input);
        let gather = |dir, block| frame_on(Plan::Gather, op, total, dir, block, bytes(n, 14));
        let streams = vec![gather(Dir::Right, 4), gather(Dir::Left, 1), vec![], vec![]];
        write(
            &ring,
            &format!("world5-gather-{len}"),
            &streams_input(0, len, 2 << 2 | 2 << 5, streams),
        );
        let streams = vec![vec![], bruck(1), [bruck(2), bruck(3)].concat()];
        write(
            &ring,
            &format!("world4-long-hops-{len}"),
            &streams_input(0, len, 7 << 2 | 1 << 5, streams),
        );
    }
    let allgather =
        |block| frame_on(Plan::Bruck, Op::AllgatherBytes, 5, Dir::Right, block, bytes(5, 15));
    let streams = vec![vec![], allgather(1), [allgather(2), allgather(3)].concat()];
    write(&ring, "world4-long-hops-allgather", &streams_input(3, 5, 7 << 2 | 1 << 5, streams));

    // The trainers' ops (selector bits 4 to 6), world two: rank 1's honest frames, rightward.
    let honest_on = |plan, op, total: u64, block, payload: Vec<u8>| {
        frame_on(plan, op, total, Dir::Right, block, payload)
    };
    let honest = |op, total, block, payload| honest_on(Plan::Gather, op, total, block, payload);
    let typed = [
        (1u8, Op::allreduce(Reduction::Min, Dtype::F32), 4u64),
        (2, Op::allreduce(Reduction::Sum, Dtype::U64), 8),
        (3, Op::allreduce(Reduction::Max, Dtype::I32), 4),
        // Bit 7 with the trainers' op 1: the sum of i128.
        (0x8 | 1, Op::allreduce(Reduction::Sum, Dtype::I128), 16),
    ];
    for (k, op, width) in typed {
        for len in [0u16, 1, 9, 700] {
            let total = u64::from(len) * width;
            let mut input = vec![k << 4, len as u8, (len >> 8) as u8];
            input.extend(honest(op, total, 1, bytes(total as usize, k)));
            write(&ring, &format!("{}-{len}", op.name()), &input);
        }
    }
    for len in [0u16, 1, 3, 4] {
        // Rank r's block is (len + r) % 5 records of 4 bytes; rank 0 takes block 0 in.
        let blocks = [usize::from(len) % 5 * 4, (usize::from(len) + 1) % 5 * 4];
        let total = (blocks[0] + blocks[1]) as u64;
        let op = Op::ReduceScatterRecords;
        let frame = honest_on(Plan::Ring, op, total, 0, bytes(blocks[0], 9));
        let input = [vec![4 << 4, len as u8, 0], frame];
        write(&ring, &format!("reduce-scatter-records-{len}"), &input.concat());
    }
    for len in [0u16, 4, 12, 400] {
        // Records of 4 bytes cut in two segments (the first longer): block 0 folded, block 1.
        let records = usize::from(len) / 4;
        let seg = [records.div_ceil(2) * 4, records / 2 * 4];
        let (op, total) = (Op::AllreduceRecords, (records * 4) as u64);
        // The reduce-scatter's frame, then the gather's: one call, the ring's path in both.
        let stream = [
            honest_on(Plan::Ring, op, total, 0, bytes(seg[0], 10)),
            honest_on(Plan::Ring, op, total, 1, bytes(seg[1], 11)),
        ];
        let input = [vec![5 << 4, len as u8, (len >> 8) as u8], stream.concat()];
        write(&ring, &format!("allreduce-records-{len}"), &input.concat());
    }
    for len in [0u16, 1, 6, 13] {
        // Rank r's block is (len + r) % 7 bytes; rank 0 takes rank 1's in, rightward.
        let blocks = [usize::from(len) % 7, (usize::from(len) + 1) % 7];
        let total = (blocks[0] + blocks[1]) as u64;
        let stream = honest(Op::AllgatherBlocks, total, 1, bytes(blocks[1], 14));
        let input = [vec![0x80, len as u8, 0], stream];
        write(&ring, &format!("allgather-blocks-{len}"), &input.concat());
    }
    let claim = |len: u64, root: u64| [len.to_le_bytes(), root.to_le_bytes()].concat();
    for (theirs, mine) in [(0u64, 0u16), (5, 3), (700, 1), (1 << 40, 2)] {
        let op = Op::AllgatherVarlen;
        let total = theirs.saturating_add(u64::from(mine));
        let stream = [
            honest(op, 16, 1, claim(theirs, 0)),
            honest(op, total, 1, bytes(theirs.min(700) as usize, 12)),
        ];
        let input = [vec![6 << 4, mine as u8, 0], stream.concat()];
        write(&ring, &format!("allgather-varlen-{theirs}-{mine}"), &input.concat());
    }
    for (len, root) in [(0u64, 1u64), (9, 1), (9, 0)] {
        let op = Op::BroadcastBytes;
        let stream =
            [honest(op, 16, 1, claim(len, root)), honest(op, len, 1, bytes(len as usize, 13))];
        let input = [vec![7 << 4, 4, 0], stream.concat()];
        write(&ring, &format!("broadcast-{len}-from-{root}"), &input.concat());
    }

    // Rank 0's exchange: a world byte, then strangers as (flags, length, bytes); flags bit 0
    // opens with a valid Hello for rank flags >> 1.
    let exchange = root.join("exchange_rank0");
    let stranger = |flags: u8, bytes: &[u8]| [&[flags, bytes.len() as u8][..], bytes].concat();
    let honest_hello = Connector::start(b"k", [0; 32], 3, 1, 0, [1; 16]).1.encode();
    let mut wrong_proof = Message::decode(&honest_hello).unwrap();
    wrong_proof.kind = MessageKind::Proof;
    wrong_proof.rank = u32::MAX;
    let proof = wrong_proof.encode();
    write(&exchange, "no-strangers", &[1]);
    write(&exchange, "garbage", &[&[0u8][..], &stranger(0, &[0x16; 40])].concat());
    write(&exchange, "hello-then-silence", &[&[1u8][..], &stranger(1 | 2 << 1, &[])].concat());
    write(
        &exchange,
        "hello-then-forged-proof",
        &[&[1u8][..], &stranger(1 | 1 << 1, &proof)].concat(),
    );
    write(&exchange, "hello-for-rank-0", &[&[2u8][..], &stranger(1, &proof[..20])].concat());
    write(&exchange, "hello-outside-the-world", &[&[0u8][..], &stranger(1 | 2 << 1, &[])].concat());
    write(
        &exchange,
        "raw-hello-and-address",
        &[&[1u8][..], &stranger(0, &[&honest_hello[..], &[4; 19]].concat())].concat(),
    );
    let many: Vec<u8> = (0..8u8).flat_map(|i| stranger(i, &[i; 7])).collect();
    write(&exchange, "eight-strangers", &[&[3u8][..], &many].concat());

    println!("seeds written under {}", root.display());
}
