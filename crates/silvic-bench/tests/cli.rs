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
fn threads_print_the_peers_csv_for_every_op() {
    let mut args = vec!["--world", "2", "--threads", "--op", "all", "--csv", "-q"];
    args.extend(QUICK);
    let out = run(&args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert_eq!(out.stderr, b"", "quiet means no progress");
    let headers = stdout
        .lines()
        .filter(|l| *l == "world,bytes,iters,reps,median_us,min_us,algbw_GBs,busbw_GBs");
    assert_eq!(headers.count(), 4, "{stdout}");
    for op in ["sum_f64", "sum_i64", "max_f64", "allgather"] {
        assert!(stdout.contains(&format!("# {op}\n")), "{stdout}");
    }
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("2,")).collect();
    assert_eq!(rows.len(), 12, "{stdout}");
    assert!(rows.iter().all(|r| r.split(',').count() == 8), "{stdout}");
}

#[test]
fn ranks_started_separately_meet_in_a_folder() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("silvic-bench-cli-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let dir_arg = dir.display().to_string();
    let children: Vec<Child> = (0..2)
        .rev()
        .map(|rank| {
            let rank = rank.to_string();
            let mut args = vec![
                "--world",
                "2",
                "--rank",
                &rank,
                "--rendezvous",
                &dir_arg,
                "--host",
                "127.0.0.1",
                "--csv",
                "-q",
                "--timeout",
                "30",
            ];
            args.extend(QUICK);
            bench().args(&args).env("SILVIC_BENCH_TOKEN", "cli-test").spawn().unwrap()
        })
        .collect();
    let outputs: Vec<Output> = children.into_iter().map(finish).collect();
    for out in &outputs {
        assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
    }
    // Rank 0 (started second) prints; rank 1 prints nothing. Both withdrew their files.
    assert_eq!(text(&outputs[1].stdout).lines().filter(|l| l.starts_with("2,")).count(), 3);
    assert_eq!(outputs[0].stdout, b"");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_flags_exit_with_code_2_and_say_why() {
    for (args, says) in [
        (&["--world", "0"][..], "--world"),
        (&["--sizes", "12"], "12"),
        (&["--op", "nope"], "nope"),
        (&["--rank", "0"], "--rendezvous"),
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(says) && stderr.starts_with("error:"), "{args:?}: {stderr}");
    }
}
