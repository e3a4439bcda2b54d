//! A start that waits on a rank that never comes says so, at the warning level, while it
//! waits: `connect` names the rank, its address and what it saw from it, and `from_env`'s
//! joining rank names rank 0's exchange and its last error. Each warning comes after 5 s,
//! then each time the wait doubles (`wait::Reminder`).
//!
//! The warnings are read from the process's global subscriber (a scoped one may miss a call
//! site that another thread reached first, see `rendezvous.rs`); each test picks out its own
//! lines by the address only it waits on. Every test is bounded by its rank's own timeout.

mod common;

use std::net::TcpListener;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use common::{Capture, MARGIN};
use silvic_net::{ConnectError, TcpCollective};

fn capture() -> &'static Capture {
    static LOG: OnceLock<Capture> = OnceLock::new();
    LOG.get_or_init(|| {
        let capture = Capture::default();
        tracing::subscriber::set_global_default(capture.subscriber()).expect("no other subscriber");
        capture
    })
}

/// An address of this host where nothing listens: a rank that never started.
fn dead_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// Runs `start` on a thread and notes when each new warning line containing `marker` appears
/// (after the start), until it returns; returns its result, and each such line with the time
/// it appeared.
fn watch_warnings<T: Send + 'static>(
    marker: &str,
    start: impl FnOnce() -> T + Send + 'static,
) -> (T, Vec<(Duration, String)>) {
    let log = capture();
    let started = Instant::now();
    let running = thread::spawn(start);
    let mut seen: Vec<(Duration, String)> = Vec::new();
    let mut look = || {
        let text = log.text();
        let ours = text.lines().filter(|l| l.contains(marker) && l.contains("WARN"));
        for line in ours.skip(seen.len()).collect::<Vec<_>>() {
            seen.push((started.elapsed(), line.to_string()));
        }
    };
    while !running.is_finished() {
        look();
        thread::sleep(Duration::from_millis(20));
    }
    look();
    (running.join().expect("the start panicked"), seen)
}

/// The variables of rank 1 of a world of 2 that meets at `rendezvous` (`from_vars`).
fn rank_1_of_2(rendezvous: String) -> impl Fn(&str) -> Option<String> {
    move |name: &str| match name {
        "SILVIC_RANK" => Some("1".to_string()),
        "SILVIC_WORLD_SIZE" => Some("2".to_string()),
        "SILVIC_RENDEZVOUS" => Some(rendezvous.clone()),
        "SILVIC_JOB_TOKEN" => Some("start-warnings-token-0123456789".to_string()),
        _ => None,
    }
}

#[test]
fn connect_waiting_on_a_rank_that_never_starts_names_it_within_10s_and_again_as_the_wait_doubles() {
    let listener = TcpCollective::bind("127.0.0.1").unwrap();
    let missing = dead_address();
    let addresses = vec![listener.address(), missing.clone()];
    let timeout = Duration::from_secs(11);
    let marker = format!("rank 1 at {missing}");
    let (outcome, warnings) = watch_warnings(&marker, move || {
        TcpCollective::connect(listener, 0, &addresses, "start-warnings-token-0123456789", timeout)
            .map(drop)
    });
    let error = outcome.unwrap_err();
    assert!(matches!(error, ConnectError::Timeout { peer: 1, .. }), "{error}");
    assert!(warnings.len() >= 2, "warnings: {warnings:#?}");
    let (first_at, first) = &warnings[0];
    assert!(*first_at < Duration::from_secs(10), "the first warning came at {first_at:?}");
    assert!(first.contains("rank 0 has waited 5 s to form its ring"), "{first}");
    assert!(
        first.contains("connection refused") || first.contains("Connection refused"),
        "{first}"
    );
    let (second_at, second) = &warnings[1];
    assert!(second.contains("has waited 10 s"), "{second}");
    assert!(*second_at >= *first_at + Duration::from_secs(4), "{warnings:#?}");
    assert!(*second_at < timeout + MARGIN, "{warnings:#?}");
}

#[test]
fn a_rank_joining_from_env_says_rank_0_does_not_answer_while_it_waits() {
    let missing = dead_address();
    let marker = format!("address exchange at {missing}");
    let rendezvous = format!("tcp://{missing}");
    let timeout = Duration::from_secs(7);
    let (outcome, warnings) = watch_warnings(&marker, move || {
        TcpCollective::from_vars(rank_1_of_2(rendezvous), timeout).map(drop)
    });
    let error = outcome.unwrap_err();
    assert!(matches!(error, ConnectError::Timeout { peer: 0, .. }), "{error}");
    let [(at, line)] = warnings.as_slice() else { panic!("one warning expected: {warnings:#?}") };
    assert!(*at < timeout, "{at:?}");
    assert!(line.contains("rank 1 has waited 5 s"), "{line}");
    assert!(line.contains("rank 0 has not answered; last error:"), "{line}");
    assert!(line.contains("check that rank 0 is running"), "{line}");
}

#[test]
fn a_rendezvous_host_that_does_not_resolve_is_named_at_the_first_failure_then_retried() {
    // `.invalid` never resolves (RFC 6761); a typo in a host name looks the same.
    let host = "silvic-start-warnings.invalid";
    let marker = format!("cannot resolve the rendezvous host {host:?}");
    let timeout = Duration::from_secs(4);
    let (outcome, warnings) = watch_warnings(&marker, move || {
        let vars = rank_1_of_2(format!("tcp://{host}:29500"));
        let started = Instant::now();
        (TcpCollective::from_vars(vars, timeout).map(drop), started.elapsed())
    });
    let (outcome, took) = outcome;
    // Retried until the timeout (a name that appears later, as a Kubernetes service's does, is
    // still found), then refused naming the variable and the host.
    assert!(took >= timeout, "gave up after {took:?}");
    let error = outcome.unwrap_err();
    let ConnectError::Environment { variable, message } = &error else { panic!("{error}") };
    assert_eq!(variable, "SILVIC_RENDEZVOUS", "{error}");
    assert!(message.contains(&marker), "{error}");
    // Said once, at the first failure, not after the whole timeout.
    let [(at, line)] = warnings.as_slice() else { panic!("one warning expected: {warnings:#?}") };
    assert!(*at < timeout, "the warning came at {at:?}");
    assert!(line.contains("retrying until the timeout"), "{line}");
}
