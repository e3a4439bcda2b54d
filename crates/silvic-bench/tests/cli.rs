//! The silvic-bench binary end to end, with tiny sizes: each mode runs a real ring on loopback,
//! prints what it should and exits with the right code. Every run is bounded in time.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);

fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_silvic-bench"));
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Waits for `child` at most [`LIMIT`]; kills it and fails the test past that.
fn finish(mut child: Child) -> Output {
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("silvic-bench did not finish within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn run(args: &[&str]) -> Output {
    finish(bench().args(args).spawn().expect("start silvic-bench"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const QUICK: &[&str] = &["--sizes", "8,4K,40K", "--seconds-per-size", "0.01", "--warmup", "1"];

#[test]
fn processes_print_a_checked_table() {
    let mut args = vec!["--world", "3"];
    args.extend(QUICK);
    let out = run(&args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("world 3, one process per rank"), "{stdout}");
    assert!(stdout.contains("Out of bounds values : 0 OK"), "{stdout}");
    let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    assert!(rows[2].trim_start().starts_with("40960") && rows[2].contains("double"), "{stdout}");
    assert!(stderr.contains("[3/3] sum_f64 40 KiB"), "progress line missing: {stderr}");
}

#[test]
fn threads_print_one_csv_for_every_op() {
    let mut args = vec!["--world", "2", "--threads", "--op", "all", "--csv", "-q"];
    args.extend(QUICK);
    let out = run(&args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert_eq!(out.stderr, b"", "quiet means no progress");
    let lines: Vec<&str> = stdout.lines().collect();
    // One header, the peers' columns first, then one row per op and size; nothing else.
    assert_eq!(lines[0], "world,bytes,iters,reps,median_us,min_us,algbw_GBs,busbw_GBs,op");
    assert_eq!(lines.len(), 1 + 4 * 3, "{stdout}");
    for (k, op) in ["sum_f64", "sum_i64", "max_f64", "allgather"].iter().enumerate() {
        for row in &lines[1 + 3 * k..4 + 3 * k] {
            let fields: Vec<&str> = row.split(',').collect();
            assert_eq!(fields.len(), 9, "{row}");
            assert_eq!((fields[0], fields[8]), ("2", *op), "{row}");
            assert!(fields[1..8].iter().all(|f| f.parse::<f64>().is_ok()), "{row}");
        }
    }
}

#[test]
fn json_prints_one_object_per_row() {
    let mut args = vec!["--world", "2", "--threads", "--op", "all", "--json", "-q"];
    args.extend(QUICK);
    args.extend(["--link-mbit", "8000"]);
    let out = run(&args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let rows: Vec<serde_json::Value> =
        stdout.lines().map(|l| serde_json::from_str(l).expect(l)).collect();
    assert_eq!(rows.len(), 12, "{stdout}");
    for row in &rows {
        assert_eq!(row["world"], 2, "{row}");
        assert_eq!(row["wrong"], 0, "{row}");
        assert_eq!(row["link_GBs"], 1.0, "{row}");
        let busbw = row["busbw_GBs"].as_f64().unwrap();
        assert_eq!(row["link"].as_f64().unwrap(), busbw, "{row}");
        assert_eq!(row["in_place"], row["op"] != "allgather", "{row}");
    }
    let sizes: Vec<u64> = rows.iter().take(3).map(|r| r["bytes"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [8, 4096, 40960]);
}

#[test]
fn the_link_limit_reports_every_ranks_flow() {
    let args = ["--world", "3", "--threads", "--link-limit", "--seconds-per-size", "0.1"];
    let out = run(&[&args[..], &["--stream-bytes", "300K"]].concat());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("through buffers of 307200 bytes"), "{stdout}");
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    for (host, row) in rows.iter().enumerate() {
        assert_eq!(row[0], host.to_string(), "{stdout}");
        assert!(row[1].parse::<u64>().unwrap() > 0, "host {host} received nothing: {stdout}");
    }
}

/// Two namespace hosts shaped to 100 Mbit/s: the ranks meet, every result is right, the
/// link column is there, and the hosts are gone afterwards. Root only: like the test bed's
/// `netns_` tests, nextest's default profile skips it and `--profile ci` runs it.
#[test]
fn netns_hosts_run_a_checked_ring_and_leave_nothing_behind() {
    silvic_testbed::net::require("netns_hosts_run_a_checked_ring_and_leave_nothing_behind");
    let child = bench()
        .args(["--netns-hosts", "2", "--link-mbit", "100", "--timeout", "20", "--json", "-q"])
        .args(["--sizes", "8,64K", "--seconds-per-size", "0.01", "--warmup", "1"])
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = finish(child);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let rows: Vec<serde_json::Value> =
        stdout.lines().map(|l| serde_json::from_str(l).expect(l)).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for row in &rows {
        assert_eq!(row["wrong"], 0, "{row}");
        let link = row["link"].as_f64().unwrap();
        assert!(link > 0.0, "{row}");
    }
    let namespaces = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = text(&namespaces.stdout);
    assert!(!left.contains(&format!("svt-{pid}-")), "namespaces left behind: {left}");
}

/// Starts ranks 1 then 0 of a world of 2 as separate processes meeting at `rendezvous`, with
/// `token` in SILVIC_BENCH_TOKEN; returns their outputs, rank 0's first.
fn two_ranks(rendezvous: &str, extra: &[&str]) -> Vec<Output> {
    two_ranks_with_token(rendezvous, extra, "cli-test-token-0123456789")
}

fn two_ranks_with_token(rendezvous: &str, extra: &[&str], token: &str) -> Vec<Output> {
    let mut children: Vec<Child> = (0..2)
        .rev()
        .map(|rank| {
            let rank = rank.to_string();
            let mut args = vec!["--world", "2", "--rank", &rank, "--rendezvous", rendezvous];
            args.extend(extra);
            args.extend(["--csv", "-q", "--timeout", "30"]);
            args.extend(QUICK);
            bench()
                .args(&args)
                .env("SILVIC_BENCH_TOKEN", token)
                .env_remove("RUST_LOG")
                .env_remove("SILVIC_SOCKET_IFNAME")
                .env_remove("SILVIC_PORTS")
                .spawn()
                .unwrap()
        })
        .collect();
    children.reverse();
    children.into_iter().map(finish).collect()
}

/// Rank 0 printed the CSV's three rows, rank 1 nothing; both succeeded.
fn assert_rank_0_printed(outputs: &[Output]) {
    for out in outputs {
        assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
    }
    assert_eq!(text(&outputs[0].stdout).lines().filter(|l| l.starts_with("2,")).count(), 3);
    assert_eq!(outputs[1].stdout, b"");
}

#[test]
fn ranks_started_separately_meet_in_a_folder_they_create() {
    let base: PathBuf =
        std::env::temp_dir().join(format!("silvic-bench-cli-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    // Neither the folder nor its parent exists: the ranks make them, as from_env does.
    let dir = base.join("meet");
    let outputs = two_ranks(&dir.display().to_string(), &["--host", "127.0.0.1"]);
    assert_rank_0_printed(&outputs);
    // Both withdrew their files.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(&base).unwrap();
}

/// A port free now on every address, below the ephemeral range (32768 and up on Linux): rank 1
/// dials it until rank 0 serves it, and an ephemeral port could meanwhile be handed to another
/// test's listener, which rank 1 would then dial.
fn exchange_port() -> u16 {
    let start = 21_000 + (std::process::id() % 4_000) as u16;
    (start..start + 4_000)
        .find(|&port| std::net::TcpListener::bind(("0.0.0.0", port)).is_ok())
        .expect("a free port below the ephemeral range")
}

#[test]
fn ranks_started_separately_meet_at_rank_0s_address_exchange() {
    let outputs = two_ranks(&format!("tcp://127.0.0.1:{}", exchange_port()), &[]);
    assert_rank_0_printed(&outputs);
}

#[test]
fn the_librarys_warnings_reach_stderr_without_colour_codes() {
    let dir = std::env::temp_dir().join(format!("silvic-bench-cli-warn-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let outputs =
        two_ranks_with_token(&dir.display().to_string(), &["--host", "127.0.0.1"], "short");
    let _ = std::fs::remove_dir_all(&dir);
    assert_rank_0_printed(&outputs);
    for out in &outputs {
        let stderr = text(&out.stderr);
        assert!(stderr.contains("WARN") && stderr.contains("job token is shorter"), "{stderr}");
        assert!(!stderr.contains('\x1b'), "colour codes into a pipe: {stderr:?}");
    }
}

#[test]
fn a_multi_host_rank_without_a_token_is_a_usage_error_naming_the_variable() {
    let out = finish(
        bench()
            .args(["--world", "2", "--rank", "0", "--rendezvous", "tcp://127.0.0.1:9"])
            .env_remove("SILVIC_BENCH_TOKEN")
            .spawn()
            .unwrap(),
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.starts_with("error:") && stderr.contains("SILVIC_BENCH_TOKEN"), "{stderr}");
}

#[test]
fn help_names_the_token_variable_and_both_rendezvous() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for says in ["SILVIC_BENCH_TOKEN", "tcp://HOST:PORT", "RUST_LOG"] {
        assert!(help.contains(says), "--help does not mention {says}: {help}");
    }
}

#[test]
fn relays_hold_every_hop_for_the_link_delay() {
    // World 3: 8 B is gathered in one hop, 2 MiB (too large for the gather's memory bound,
    // however long a hop) takes the ring's 2 + 1 hops, one after the other. Every hop crosses a
    // relay that holds it 3 ms, so no call can take less.
    let delay_us = 3000.0;
    let args = ["--world", "3", "--threads", "--link-delay-us", "3000", "--sizes", "8,2M"];
    let quick = ["--seconds-per-size", "0.01", "--warmup", "1", "--csv", "-q"];
    let out = run(&[&args[..], &quick[..]].concat());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let rows: Vec<Vec<f64>> = stdout
        .lines()
        .skip(1)
        .map(|row| row.split(',').take(8).map(|f| f.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for (row, hops) in rows.iter().zip([1.0, 3.0]) {
        // Columns: world, bytes, iters, reps, median_us, min_us, ...
        assert!(row[5] >= hops * delay_us, "{hops} hops of {delay_us} us: {stdout}");
    }
}

#[test]
fn relays_cap_every_stream_at_the_flow_rate() {
    // World 3, 2 MiB on the ring: each rank sends 2(n-1)/n of the buffer, over its two
    // neighbours' streams, each capped at 80 Mbit/s (10 MB/s) each way by its relay, so no call
    // can take less than that many bytes at twice the cap.
    let args = ["--world", "3", "--threads", "--flow-mbit", "80", "--sizes", "2M"];
    let quick = ["--seconds-per-size", "0.01", "--warmup", "1", "--csv", "-q"];
    let out = run(&[&args[..], &quick[..], &["--path", "ring"]].concat());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let row: Vec<f64> =
        stdout.lines().nth(1).unwrap().split(',').take(8).map(|f| f.parse().unwrap()).collect();
    let sent = 2.0 * 2.0 / 3.0 * f64::from(2u32 << 20);
    let least_us = sent / (2.0 * 10e6) * 1e6;
    assert!(row[5] >= least_us, "{sent} bytes over two 10 MB/s flows in {} us: {stdout}", row[5]);
}

#[test]
fn a_forced_path_holds_on_the_relay_bed_and_reaches_every_process() {
    // World 3 behind 3 ms relays: 8 B takes the gather's one hop unless forced onto the ring,
    // whose 2 + 1 hops go one after the other: no forced call can take less than three.
    let delay_us = 3000.0;
    let args = ["--world", "3", "--threads", "--link-delay-us", "3000", "--sizes", "8"];
    let quick = ["--seconds-per-size", "0.01", "--warmup", "1", "--csv", "-q"];
    for (path, hops) in [("auto", 1.0), ("ring", 3.0)] {
        let out = run(&[&args[..], &quick[..], &["--path", path]].concat());
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        let row: Vec<f64> =
            stdout.lines().nth(1).unwrap().split(',').take(8).map(|f| f.parse().unwrap()).collect();
        assert!(row[5] >= hops * delay_us, "--path {path}: {hops} hops of {delay_us} us: {stdout}");
    }
    // Processes: every rank is started with the path (rank 0 says so), and the run is checked.
    let mut args = vec!["--world", "3", "--path", "index"];
    args.extend(QUICK);
    let out = run(&args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("# allreduce path forced to index (--path)"), "{stdout}");
    assert!(stdout.contains("Out of bounds values : 0 OK"), "{stdout}");
}

#[test]
fn bad_flags_exit_with_code_2_and_say_why() {
    for (args, says) in [
        (&["--world", "0"][..], "--world"),
        (&["--sizes", "12"], "12"),
        (&["--op", "nope"], "nope"),
        (&["--rank", "0"], "--rendezvous"),
        (&["--link-delay-us", "100"], "--threads"),
        (&["--threads", "--link-delay-us", "0"], "--link-delay-us"),
        (&["--flow-mbit", "100"], "--threads"),
        (&["--threads", "--flow-mbit", "0"], "--flow-mbit"),
        (&["--stream-bytes", "1M"], "--link-limit"),
        (&["--threads", "--path", "rings"], "rings"),
        (&["--link-limit", "--stream-bytes", "0"], "--stream-bytes"),
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(says) && stderr.starts_with("error:"), "{args:?}: {stderr}");
    }
}

#[test]
fn simulate_prints_the_same_bytes_on_every_run() {
    let args = ["--simulate", "--world", "16", "--op", "all", "--hop-us", "100", "-q"];
    let first = run(&args);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let stdout = text(&first.stdout);
    assert!(stdout.contains("# time: simulated (a model, not a measurement)"), "{stdout}");
    let rows = stdout.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(rows, 4 * 9, "{stdout}");
    for _ in 0..2 {
        assert_eq!(run(&args).stdout, first.stdout);
    }
    let mut csv = args.to_vec();
    csv.push("--csv");
    let again = run(&csv);
    assert_eq!(again.stdout, run(&csv).stdout);
    assert!(text(&again.stdout).starts_with("world,bytes,iters,reps,median_us"));
}

#[test]
fn simulate_forces_a_path_and_auto_is_the_real_choice() {
    // World 4, 64 KiB: the cost model takes the ring (its cut is at 35 KiB).
    let row = |path: &str| {
        let out = run(&["--simulate", "--sizes", "64K", "--csv", "-q", "--path", path]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).lines().nth(1).unwrap().to_string()
    };
    let (auto, ring, gather) = (row("auto"), row("ring"), row("gather"));
    assert_eq!(auto, ring);
    assert_ne!(auto, gather);
    let out = run(&["--simulate", "--path", "rings"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("rings"), "{}", text(&out.stderr));
}

#[test]
fn simulate_reaches_a_world_of_1024() {
    let out =
        run(&["--simulate", "--world", "1024", "--op", "allgather", "--sizes", "64K", "--csv"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).lines().nth(1).unwrap().starts_with("1024,65536,1,1,"));
}
