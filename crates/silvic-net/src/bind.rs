//! [`BindOptions`]: where a rank listens, what it advertises, and on which port.
//!
//! Invariants:
//! - A port range is searched by binding each candidate in turn and moving on only at
//!   `EADDRINUSE` (at `bind` or at `listen`): the port returned is the one this socket holds,
//!   with no moment between choosing and binding where another process could take it.
//! - Every listener is opened with `SO_REUSEADDR`, so a fixed port can be bound again at once
//!   after a ring that used it ends (its old connections in `TIME_WAIT` do not block it), while
//!   a port another process listens on is still refused.
//! - The advertised address is never unspecified (`0.0.0.0`, `::`): other ranks must be able to
//!   connect to it.
//!
//! Not here: which address a launcher advertises by default (see `launch`).

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::ops::RangeInclusive;

use socket2::{Domain, Protocol, Socket, Type};

use crate::error::ConnectError;

/// Connections the kernel queues for the listener until the rendezvous accepts them (capped by
/// net.core.somaxconn). Once the queue is full the kernel drops new SYNs, the neighbour's among
/// them, which then waits out TCP's retransmission (1 s, then 3 s, 7 s...): std's 128 fills up
/// whenever a burst of strangers outpaces one turn of the rendezvous loop.
const LISTEN_BACKLOG: i32 = 4096;

/// Where `TcpCollective::bind_with` listens and what it advertises.
///
/// Start from [`BindOptions::host`] or [`BindOptions::interface`], then add
/// [`advertise`](BindOptions::advertise), [`port`](BindOptions::port) or
/// [`ports`](BindOptions::ports):
///
/// ```
/// use silvic_net::{BindOptions, TcpCollective};
///
/// let listener = TcpCollective::bind_with(&BindOptions::interface("lo").ports(29500..=29599))?;
/// assert!(listener.address().starts_with("127.0.0.1:295"));
/// let every = TcpCollective::bind_with(&BindOptions::host("0.0.0.0").advertise("127.0.0.1"))?;
/// assert!(every.address().starts_with("127.0.0.1:"));
/// # Ok::<(), silvic_net::ConnectError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindOptions {
    place: Place,
    advertise: Option<String>,
    ports: RangeInclusive<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    Host(String),
    Interface(String),
}

impl BindOptions {
    /// Listens on `host` (an IP address or a host name; `"0.0.0.0"` or `"::"` for every
    /// interface, which then needs [`advertise`](BindOptions::advertise)) and advertises it.
    pub fn host(host: &str) -> BindOptions {
        BindOptions { place: Place::Host(host.to_string()), advertise: None, ports: 0..=0 }
    }

    /// Listens on and advertises the address of the network interface `name` (such as
    /// `"eth0"`): its first IPv4 address, else its first IPv6 address.
    pub fn interface(name: &str) -> BindOptions {
        BindOptions { place: Place::Interface(name.to_string()), advertise: None, ports: 0..=0 }
    }

    /// Advertises `ip` instead of the address listened on (for NAT, containers, `0.0.0.0`).
    pub fn advertise(mut self, ip: &str) -> BindOptions {
        self.advertise = Some(ip.to_string());
        self
    }

    /// Listens on this port (by default an ephemeral one).
    pub fn port(mut self, port: u16) -> BindOptions {
        self.ports = port..=port;
        self
    }

    /// Listens on the first free port of `ports`, such as the range a firewall opens.
    pub fn ports(mut self, ports: RangeInclusive<u16>) -> BindOptions {
        self.ports = ports;
        self
    }
}

fn invalid(message: String) -> ConnectError {
    ConnectError::InvalidArgument(message)
}

/// `host` without the brackets of an IPv6 literal (`[fd00::1]` is `fd00::1`); a host whose
/// brackets do not pair (`[fd00::1`) is left as it is, and so fails to parse or resolve.
pub(crate) fn unbracket(host: &str) -> &str {
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

/// Parses an IP address, with or without IPv6 brackets.
pub(crate) fn parse_ip(text: &str) -> Option<IpAddr> {
    unbracket(text).parse().ok()
}

/// An IP address, or the first address `host` resolves to.
pub(crate) fn resolve(host: &str) -> Result<IpAddr, ConnectError> {
    if let Some(ip) = parse_ip(host) {
        return Ok(ip);
    }
    (unbracket(host), 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| a.ip())
        .ok_or_else(|| invalid(format!("{host:?} is not an IP address or a known host")))
}

/// The address of interface `name`: its first IPv4 address, else its first IPv6 one.
pub(crate) fn interface_address(name: &str) -> Result<IpAddr, ConnectError> {
    let interfaces = if_addrs::get_if_addrs().map_err(|e| {
        let listing = io::Error::new(e.kind(), format!("cannot list the network interfaces: {e}"));
        ConnectError::bind(format!("interface {name}"), &listing)
    })?;
    let mine = || interfaces.iter().filter(|i| i.name == name).map(|i| i.ip());
    if let Some(ip) = mine().find(IpAddr::is_ipv4).or_else(|| mine().next()) {
        return Ok(ip);
    }
    // An interface with both an IPv4 and an IPv6 address is listed twice, not side by side.
    let mut available: Vec<String> = Vec::new();
    for interface in &interfaces {
        if !available.contains(&interface.name) {
            available.push(interface.name.clone());
        }
    }
    Err(ConnectError::NoInterface { name: name.to_string(), available })
}

/// Opens a listener on `address`; `host` names it in errors.
pub(crate) fn listen(host: &str, address: SocketAddr) -> Result<TcpListener, ConnectError> {
    try_listen(address).map_err(|e| ConnectError::bind(host, &e))
}

fn try_listen(address: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?; // as std does on Unix
    // Before any connection: accepted streams inherit it (`congestion`'s module doc says why).
    crate::congestion::configure(&socket);
    socket.bind(&address.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// Binds the first free port of `ports` on `ip`. Each candidate is bound for real; only
/// `EADDRINUSE` moves on to the next, so the port is never free for someone else in between.
fn listen_in_range(
    host: &str,
    ip: IpAddr,
    ports: &RangeInclusive<u16>,
) -> Result<TcpListener, ConnectError> {
    for port in ports.clone() {
        match try_listen(SocketAddr::new(ip, port)) {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(ConnectError::bind(host, &e)),
        }
    }
    Err(ConnectError::PortsTaken {
        host: host.to_string(),
        first: *ports.start(),
        last: *ports.end(),
    })
}

/// Opens the listener `options` describe; returns it with the address to advertise.
pub(crate) fn bind_with(options: &BindOptions) -> Result<(TcpListener, SocketAddr), ConnectError> {
    let (host, ip) = match &options.place {
        Place::Host(host) => (host.clone(), resolve(host)?),
        Place::Interface(name) => (format!("interface {name}"), interface_address(name)?),
    };
    if options.ports.is_empty() {
        return Err(invalid(format!(
            "the port range {}-{} is empty",
            options.ports.start(),
            options.ports.end()
        )));
    }
    if *options.ports.start() == 0 && *options.ports.end() != 0 {
        return Err(invalid(format!(
            "the port range {}-{} includes port 0 (an ephemeral port); give real ports",
            options.ports.start(),
            options.ports.end()
        )));
    }
    let advertised_ip = match &options.advertise {
        Some(text) => parse_ip(text)
            .ok_or_else(|| invalid(format!("advertise {text:?} is not an IP address")))?,
        None => ip,
    };
    if advertised_ip.is_unspecified() {
        let what = options.advertise.as_deref().unwrap_or(&host);
        return Err(invalid(format!(
            "cannot advertise {what}: other nodes cannot reach it; give an address to advertise"
        )));
    }
    let listener = listen_in_range(&host, ip, &options.ports)?;
    let port = listener.local_addr().map_err(|e| ConnectError::bind(&host, &e))?.port();
    Ok((listener, SocketAddr::new(advertised_ip, port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_set_what_they_say() {
        let o = BindOptions::interface("eth0").ports(29500..=29599).advertise("10.0.0.1");
        assert_eq!(o.place, Place::Interface("eth0".into()));
        assert_eq!(o.ports, 29500..=29599);
        assert_eq!(o.advertise.as_deref(), Some("10.0.0.1"));
        assert_eq!(BindOptions::host("::1").port(7).ports, 7..=7);
        assert_eq!(BindOptions::host("::1").ports, 0..=0);
    }

    #[test]
    fn bad_ranges_and_unreachable_addresses_are_refused_before_binding() {
        let (first, last) = (10, 9); // as a caller's computed range can be
        let e = bind_with(&BindOptions::host("127.0.0.1").ports(first..=last)).unwrap_err();
        assert!(e.to_string().contains("10-9 is empty"), "{e}");
        let e = bind_with(&BindOptions::host("127.0.0.1").ports(0..=9)).unwrap_err();
        assert!(e.to_string().contains("port 0"), "{e}");
        let e = bind_with(&BindOptions::host("0.0.0.0")).unwrap_err();
        assert!(e.to_string().contains("cannot advertise 0.0.0.0"), "{e}");
        let e = bind_with(&BindOptions::host("127.0.0.1").advertise("::")).unwrap_err();
        assert!(e.to_string().contains("cannot advertise ::"), "{e}");
        let e = bind_with(&BindOptions::host("127.0.0.1").advertise("node-7")).unwrap_err();
        assert!(e.to_string().contains("\"node-7\" is not an IP address"), "{e}");
    }

    #[test]
    fn an_unknown_interface_names_the_ones_that_exist() {
        let e = bind_with(&BindOptions::interface("nosuch0")).unwrap_err();
        let ConnectError::NoInterface { name, available } = &e else { panic!("{e}") };
        assert_eq!(name, "nosuch0");
        assert!(available.iter().any(|n| n == "lo"), "{e}");
        let mut once = available.clone();
        once.sort();
        once.dedup();
        assert_eq!(once.len(), available.len(), "each interface once: {e}");
        assert!(e.to_string().contains("lo"), "{e}");
    }
}
