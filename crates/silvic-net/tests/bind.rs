//! `bind_with`: ports, ranges and the loopback mix, on this host's loopback.
//!
//! Each test that needs known port numbers binds on its own loopback address, 127.x.y.1 with
//! x.y from the process id and a per-test byte, so parallel test processes (and other jobs on
//! the same host that bind 127.0.0.1) never hold the ports it counts on.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use silvic_net::{BindOptions, Collective, ConnectError, RingListener, TcpCollective};

/// A loopback address of this test process alone (for ports bound on that address).
fn own_loopback(test: u8) -> String {
    let pid = std::process::id();
    format!("127.{}.{}.{test}", (pid >> 8) & 0xff, pid & 0xff)
}

/// Connects a ring from `listeners` (each rank in a thread), runs one allreduce, and returns
/// the listening ports; fails the test past `limit`.
fn ring_once(listeners: Vec<RingListener>, limit: Duration) -> Vec<f64> {
    let addresses: Vec<String> = listeners.iter().map(RingListener::address).collect();
    let (done, results) = mpsc::channel();
    for (rank, listener) in listeners.into_iter().enumerate() {
        let (addresses, done) = (addresses.clone(), done.clone());
        thread::spawn(move || {
            let result = TcpCollective::connect(listener, rank, &addresses, "t", limit).and_then(
                |mut ring| {
                    let mut buf = [rank as f64 + 1.0];
                    ring.allreduce_sum_f64(&mut buf).map_err(|e| {
                        ConnectError::InvalidArgument(format!("allreduce failed: {e}"))
                    })?;
                    Ok(buf[0])
                },
            );
            let _ = done.send(result);
        });
    }
    drop(done);
    (0..addresses.len())
        .map(|_| results.recv_timeout(limit).expect("a rank hung").expect("a rank failed"))
        .collect()
}

#[test]
fn a_fixed_port_is_bound_again_at_once_after_a_ring_on_it_ends() {
    let host = own_loopback(1);
    let first: Vec<RingListener> =
        (0..3).map(|_| TcpCollective::bind_with(&BindOptions::host(&host)).unwrap()).collect();
    let ports: Vec<u16> =
        first.iter().map(|l| l.address().rsplit(':').next().unwrap().parse().unwrap()).collect();
    assert_eq!(ring_once(first, Duration::from_secs(20)), [6.0; 3]);
    // The ring's connections are closed now, some of them in TIME_WAIT on these very ports.
    let again: Vec<RingListener> = ports
        .iter()
        .map(|&p| TcpCollective::bind_with(&BindOptions::host(&host).port(p)).unwrap())
        .collect();
    for (listener, port) in again.iter().zip(&ports) {
        assert_eq!(listener.address(), format!("{host}:{port}"));
    }
    assert_eq!(ring_once(again, Duration::from_secs(20)), [6.0; 3]);
}

#[test]
fn a_range_hands_out_its_first_free_ports_then_fails_naming_itself() {
    let host = own_loopback(2);
    let options = BindOptions::host(&host).ports(29500..=29502);
    let mut held: Vec<RingListener> =
        (0..3).map(|_| TcpCollective::bind_with(&options).unwrap()).collect();
    let got: Vec<String> = held.iter().map(RingListener::address).collect();
    assert_eq!(got, [29500, 29501, 29502].map(|p| format!("{host}:{p}")));
    let e = TcpCollective::bind_with(&options).unwrap_err();
    assert!(matches!(&e, ConnectError::PortsTaken { first: 29500, last: 29502, .. }), "{e:?}");
    assert_eq!(e.to_string(), format!("every port of 29500-29502 is taken on {host}"));
    // A port freed in the middle is the next one handed out.
    drop(held.remove(1));
    assert_eq!(TcpCollective::bind_with(&options).unwrap().address(), format!("{host}:29501"));
}

#[test]
fn a_fixed_port_another_listener_holds_is_refused_naming_it() {
    let host = own_loopback(3);
    let plain = std::net::TcpListener::bind(format!("{host}:0")).unwrap();
    let taken = plain.local_addr().unwrap().port();
    let e = TcpCollective::bind_with(&BindOptions::host(&host).port(taken)).unwrap_err();
    drop(plain);
    assert_eq!(e.to_string(), format!("port {taken} is taken on {host}"));
}

#[test]
fn an_interface_listens_on_and_advertises_its_address() {
    let listener = TcpCollective::bind_with(&BindOptions::interface("lo")).unwrap();
    assert!(listener.address().starts_with("127.0.0.1:"), "{}", listener.address());
    let listener =
        TcpCollective::bind_with(&BindOptions::host("0.0.0.0").advertise("127.0.0.1")).unwrap();
    assert!(listener.address().starts_with("127.0.0.1:"), "{}", listener.address());
    let e = TcpCollective::bind_with(&BindOptions::interface("eth-nope")).unwrap_err();
    assert!(e.to_string().contains("no network interface \"eth-nope\""), "{e}");
    assert!(e.to_string().contains("lo"), "{e}");
}

#[test]
fn a_list_mixing_loopback_and_remote_addresses_is_refused_naming_the_rank() {
    let listener = TcpCollective::bind("127.0.0.1").unwrap();
    let addresses =
        vec!["10.0.0.1:29500".to_string(), "10.0.0.2:29500".to_string(), listener.address()];
    let e = TcpCollective::connect(listener, 2, &addresses, "t", Duration::from_secs(5))
        .map(drop)
        .unwrap_err();
    let ConnectError::InvalidArgument(message) = &e else { panic!("{e:?}") };
    assert!(
        message.starts_with(
            "rank 2 advertises 127.0.0.1, a loopback address, while other ranks are remote"
        ),
        "{message}"
    );
    // The refusal comes from the list, whichever rank reads it.
    let listener =
        TcpCollective::bind_with(&BindOptions::host("0.0.0.0").advertise("10.0.0.1")).unwrap();
    let addresses = vec![listener.address(), "127.0.1.1:29500".to_string()];
    let e = TcpCollective::connect(listener, 0, &addresses, "t", Duration::from_secs(5))
        .map(drop)
        .unwrap_err();
    assert!(e.to_string().contains("rank 1 advertises 127.0.1.1"), "{e}");
}
