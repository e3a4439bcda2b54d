//! No deadlock however small the socket buffers are: every op with buffers of megabytes, on
//! sockets whose kernel buffers are the smallest TCP allows.
//!
//! A ring step that wrote its whole send before reading would deadlock as soon as a step
//! outgrew what the socket buffers on the way hold; with 4 KiB buffers that is every step
//! here, by a factor of hundreds. The buffers are shrunk from outside the library, so no test
//! hook enters the production API (it sets no buffer size of its own and takes the system's):
//! the ranks run in a network namespace of their own whose `net.ipv4.tcp_wmem` and `tcp_rmem`
//! are 4096 bytes, minimum, default and maximum. Creating it needs no privilege: `unshare
//! --user --map-root-user --net` gives this unprivileged test a user namespace that owns a new
//! network namespace, where it may set those (per-namespace) sysctls and bring loopback up.
//! It needs unprivileged user namespaces (the Linux default) and `unshare` (util-linux) and
//! `ip` (iproute2); without them the test fails and says so.
//!
//! The parent starts this test binary again inside the namespace, running [`small_buffers_ring`]
//! (an ignored test of its own), and waits for its report within a bound.

mod common;

use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{MARGIN, ring_of_threads};
use silvic_net::Collective;
use silvic_testbed::child::LineChild;

/// Each of `tcp_wmem`'s and `tcp_rmem`'s three values (minimum, default, maximum), in bytes.
const SOCKET_BUFFER: usize = 4096;
const ENTRY: &str = "small_buffers_ring";
const CHILD_ENV: &str = "SILVIC_SMALL_BUFFERS";
/// Elements per allreduce (4 MiB of f64, not a multiple of 2 or 3) and bytes per allgather.
const LEN: usize = (1 << 19) + 7;
const GATHER: usize = (1 << 20) + 3;

#[test]
fn every_op_with_megabytes_on_the_smallest_socket_buffers_never_deadlocks() {
    let sysctls = format!(
        "for t in tcp_wmem tcp_rmem; do echo '{b} {b} {b}' > /proc/sys/net/ipv4/$t || exit 1; done",
        b = SOCKET_BUFFER
    );
    let script = format!("{sysctls} && ip link set lo up && exec \"$@\"");
    let mut command = Command::new("unshare");
    command
        .args(["--user", "--map-root-user", "--net", "--", "sh", "-c", &script, "sh"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", ENTRY, "--ignored", "--nocapture", "--test-threads=1"])
        .env("PATH", format!("{}:/usr/sbin:/sbin", std::env::var("PATH").unwrap_or_default()))
        .env(CHILD_ENV, "1");
    let mut child = LineChild::spawn("the namespace", command).unwrap();
    // Bounded: a few seconds here; a deadlock would never end.
    let deadline = Instant::now() + Duration::from_secs(120) + MARGIN;
    let buffers = child.wait_for(&["BUFFERS"], deadline);
    let buffers = buffers.unwrap_or_else(|e| {
        panic!(
            "could not run ranks in a network namespace of their own (unshare --user --net; \
             unprivileged user namespaces may be off here: kernel.unprivileged_userns_clone, \
             kernel.apparmor_restrict_unprivileged_userns): {e}"
        )
    });
    eprintln!("{}", buffers.text);
    let done = child.wait_for(&["DONE"], deadline).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", done.text);
    let status = child.wait_exit(MARGIN).expect("the namespace's process exits");
    assert!(status.success(), "{status}: {}", child.stderr());
}

/// Runs inside the namespace: checks that its sockets are small, then runs every op.
#[test]
#[ignore = "runs inside the network namespace of the small-buffers test, which starts it"]
fn small_buffers_ring() {
    assert!(std::env::var_os(CHILD_ENV).is_some(), "started by the small-buffers test");
    // Ends the test harness's own "test small_buffers_ring ... " line.
    println!();
    // The premise: a loopback stream here, set up as the library's are, has tiny buffers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    let sock = socket2::SockRef::from(&client);
    let (send, recv) = (sock.send_buffer_size().unwrap(), sock.recv_buffer_size().unwrap());
    let server_recv = socket2::SockRef::from(&server).recv_buffer_size().unwrap();
    println!("BUFFERS send {send} B, receive {recv} B (server side {server_recv} B)");
    for size in [send, recv, server_recv] {
        assert!(size <= 4 * SOCKET_BUFFER, "a socket buffer of {size} B is not small");
    }
    drop((client, server, listener));

    let started = Instant::now();
    for world in [2, 3] {
        let sums = ring_of_threads(world, Duration::from_secs(120), move |rank, mut ring| {
            let r = rank as f64;
            let mut sum: Vec<f64> = (0..LEN).map(|i| (i % 1000) as f64 + r).collect();
            ring.allreduce_sum_f64(&mut sum).unwrap();
            let mut ints: Vec<i64> = (0..LEN).map(|i| i as i64 * (rank as i64 + 1)).collect();
            ring.allreduce_sum_i64(&mut ints).unwrap();
            let mut max: Vec<f64> = (0..LEN).map(|i| ((i + rank) % world) as f64).collect();
            ring.allreduce_max_f64(&mut max).unwrap();
            let gathered = ring.allgather_bytes(&vec![rank as u8 + 1; GATHER]).unwrap();
            (sum, ints, max, gathered)
        });
        let tri = (world * (world - 1) / 2) as f64;
        let weights = (world * (world + 1) / 2) as i64;
        for (rank, (sum, ints, max, gathered)) in sums.iter().enumerate() {
            let wrong = (0..LEN).find(|&i| {
                sum[i] != world as f64 * (i % 1000) as f64 + tri
                    || ints[i] != i as i64 * weights
                    || max[i] != (world - 1) as f64
            });
            assert_eq!(wrong, None, "world {world} rank {rank}: first wrong element");
            assert_eq!(gathered.len(), world, "world {world} rank {rank}: allgather blocks");
            for (from, block) in gathered.iter().enumerate() {
                assert!(block.len() == GATHER && block.iter().all(|&b| b == from as u8 + 1));
            }
        }
    }
    println!("DONE every op, worlds 2 and 3, {LEN} elements, in {:?}", started.elapsed());
}
