//! Rank 0's side of the exchange: the ring's own lobby (`rendezvous::accept`) proves every
//! connection; a proven one sends its address and waits as a member; once every rank is a
//! member (each looked at once more) the list goes to all of them at once.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use tracing::{debug, warn};

use super::member::{Heard, Member, listen_to, tell};
use super::wire::{
    ADDRESS_LEN, LIST, NO_ROSTER, PING, abort_message, decode_address, duplicate_message,
    encode_address, exchange_key,
};
use crate::error::ConnectError;
use crate::rendezvous::accept::{
    ACCEPT_PAUSE, Accepted, Admission, HANDSHAKE_DEADLINE, Joined, Lobby, Refused,
};
use crate::wait::{Reminder, nonblocking, wait as poll_wait};

/// What rank 0 needs to serve the exchange.
#[derive(Debug)]
pub(crate) struct Serve<'a> {
    pub(crate) listener: &'a TcpListener,
    pub(crate) world: usize,
    /// Rank 0's own ring address.
    pub(crate) own: SocketAddr,
    pub(crate) token: &'a [u8],
    pub(crate) deadline: Instant,
    /// The rendezvous timeout, for the error.
    pub(crate) timeout: Duration,
}

/// A connection that proved the token as `rank` and is sending its ring address.
struct Proven {
    joined: Joined,
    inbox: [u8; ADDRESS_LEN],
    got: usize,
    deadline: Instant,
}

/// Rank 0's whole state while the exchange runs.
struct Server<'a> {
    plan: &'a Serve<'a>,
    listen_address: String,
    lobby: Lobby<'a>,
    proven: Vec<Proven>,
    members: Vec<Option<Member>>,
    /// The last refusal of a connection whose Hello claimed each rank, for the timeout error.
    refusals: Vec<Option<String>>,
    accept_paused_until: Option<Instant>,
    /// When the exchange says whom it still waits for.
    reminder: Reminder,
}

/// What polled ready in one turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Listener,
    Incoming(u64),
    Proven(usize),
    Member(usize),
}

/// Serves the exchange until every rank has sent its address; returns the list in rank order,
/// after sending it to every rank. On failure, every waiting rank is told why.
pub(crate) fn serve(plan: &Serve<'_>) -> Result<Vec<SocketAddr>, ConnectError> {
    let key = exchange_key(plan.token);
    let listen_address =
        plan.listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    plan.listener
        .set_nonblocking(true)
        .map_err(|e| ConnectError::io(0, listen_address.clone(), &e))?;
    let admission = Admission {
        token: &key,
        roster: NO_ROSTER,
        world: plan.world,
        rank: 0,
        peers: None,
        channels: (0, 1),
    };
    let mut server = Server {
        plan,
        listen_address,
        lobby: Lobby::admitting(admission, Vec::new()),
        proven: Vec::new(),
        members: (0..plan.world).map(|_| None).collect(),
        refusals: vec![None; plan.world],
        accept_paused_until: None,
        reminder: Reminder::new(Instant::now()),
    };
    let outcome = server.run();
    if let Err(e) = &outcome {
        server.abandon(&e.to_string());
    }
    outcome
}

impl Server<'_> {
    fn run(&mut self) -> Result<Vec<SocketAddr>, ConnectError> {
        loop {
            let now = Instant::now();
            self.settle_contests(now);
            if self.complete() && self.still_complete()? {
                return self.send_list();
            }
            if now >= self.plan.deadline {
                return Err(self.timeout_error());
            }
            if crate::cancel::cancelled(Some(now)) {
                return Err(ConnectError::Cancelled);
            }
            if let Some(waited) = self.reminder.due(now) {
                let missing = self.missing();
                let joined = self.plan.world - missing.len();
                let mut seen = String::new();
                for rank in &missing {
                    if let Some(why) = &self.refusals[*rank] {
                        seen += &format!("; a connection claiming rank {rank} {why}");
                    }
                }
                warn!(
                    "address exchange: waited {} s for ranks {missing:?} ({joined} of {} \
                     joined){seen}; check that those ranks are running, with the same \
                     rendezvous address ({}) and job token",
                    waited.as_secs(),
                    self.plan.world,
                    self.listen_address
                );
            }
            self.lobby.expire(now);
            self.lobby.report(now);
            self.proven.retain(|p| {
                let alive = now < p.deadline;
                if !alive {
                    warn!(remote = %p.joined.remote, "exchange: a proven rank sent no address in time");
                }
                alive
            });
            self.accept_paused_until = self.accept_paused_until.filter(|until| now < *until);
            self.turn()?;
        }
    }

    /// Every rank but 0 is a member, and none is contested.
    fn complete(&self) -> bool {
        self.members.iter().skip(1).all(|m| m.as_ref().is_some_and(|m| m.contender.is_none()))
    }

    fn missing(&self) -> Vec<usize> {
        (1..self.plan.world).filter(|&r| self.members[r].is_none()).collect()
    }

    /// One poll and what it found.
    fn turn(&mut self) -> Result<(), ConnectError> {
        let listening = self.accept_paused_until.is_none();
        let contests = self.members.iter().flatten().filter_map(|m| m.contender.as_ref());
        let wake = [
            Some(self.plan.deadline),
            Some(self.reminder.next_at()),
            self.accept_paused_until,
            self.lobby.next_report(),
        ]
        .into_iter()
        .flatten()
        .chain(self.lobby.held().iter().map(|p| p.deadline()))
        .chain(self.proven.iter().map(|p| p.deadline))
        .chain(contests.map(|(_, until)| *until))
        .min();
        let wake = crate::cancel::wake_by(wake, Instant::now());
        let mut slots = Vec::new();
        let mut fds = Vec::new();
        if listening {
            slots.push(Slot::Listener);
            fds.push(PollFd::new(self.plan.listener, PollFlags::IN));
        }
        for incoming in self.lobby.held() {
            let (stream, events) = incoming.poll_on();
            slots.push(Slot::Incoming(incoming.id()));
            fds.push(PollFd::new(stream, events));
        }
        for (i, p) in self.proven.iter().enumerate() {
            slots.push(Slot::Proven(i));
            fds.push(PollFd::new(&p.joined.stream, PollFlags::IN));
        }
        for (rank, member) in self.members.iter().enumerate() {
            if let Some(m) = member {
                slots.push(Slot::Member(rank));
                fds.push(PollFd::new(&m.stream, PollFlags::IN));
            }
        }
        poll_wait(&mut fds, wake).map_err(|e| ConnectError::io(0, &self.listen_address, &e))?;
        let ready: Vec<Slot> = slots
            .into_iter()
            .zip(&fds)
            .filter(|(_, fd)| !fd.revents().is_empty())
            .map(|(slot, _)| slot)
            .collect();
        drop(fds);

        for &slot in &ready {
            if let Slot::Member(rank) = slot {
                self.hear(rank)?;
            }
        }
        let refusals = &mut self.refusals;
        let joined = self.lobby.step_ready(
            |id| ready.contains(&Slot::Incoming(id)),
            |refused: &Refused| {
                if let Some(c) = refused.claims.filter(|c| (c.rank as usize) < refusals.len()) {
                    let why = format!("(from {}) was {}", refused.remote, refused.reason);
                    refusals[c.rank as usize] = Some(why);
                }
            },
        );
        let mut arrived = Vec::new();
        for (i, mut p) in std::mem::take(&mut self.proven).into_iter().enumerate() {
            if !ready.contains(&Slot::Proven(i)) {
                self.proven.push(p);
                continue;
            }
            match read_address(&mut p) {
                Ok(None) => self.proven.push(p),
                Ok(Some(address)) => arrived.push((p.joined, address)),
                Err(why) => {
                    warn!(remote = %p.joined.remote, rank = p.joined.rank, why, "exchange: dropped a proven rank");
                }
            }
        }
        let deadline = Instant::now() + HANDSHAKE_DEADLINE;
        self.proven.extend(joined.into_iter().map(|joined| Proven {
            joined,
            inbox: [0; ADDRESS_LEN],
            got: 0,
            deadline,
        }));
        for (Joined { stream, remote, rank, .. }, address) in arrived {
            debug!(%remote, %address, "address exchange: rank {rank} sent its address");
            self.claim(rank, Member::new(stream, address))?;
        }
        if ready.contains(&Slot::Listener) {
            let accepted = self
                .lobby
                .accept(self.plan.listener)
                .map_err(|e| ConnectError::io(0, &self.listen_address, &e))?;
            if accepted == Accepted::Starved {
                self.accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
            }
        }
        Ok(())
    }

    /// What member `rank`'s connection says: nothing, the answer to a ping (so a contender
    /// claims a live rank: both are duplicates), or its end (a contender takes its place).
    fn hear(&mut self, rank: usize) -> Result<(), ConnectError> {
        let Some(member) = &mut self.members[rank] else { return Ok(()) };
        let heard = listen_to(&mut member.stream);
        if matches!(heard, Heard::Nothing) {
            return Ok(());
        }
        let Some(mut first) = self.members[rank].take() else { return Ok(()) };
        match (heard, first.contender.take()) {
            (Heard::Pong, Some((second, _))) => {
                let message = duplicate_message(first.address, second.address);
                let error = ConnectError::DuplicateRank {
                    rank,
                    first: first.address.to_string(),
                    second: second.address.to_string(),
                };
                tell(first.stream, &message);
                tell(second.stream, &message);
                Err(error)
            }
            // Closed, or a PING nobody asked for: gone.
            (_, contender) => {
                warn!(rank, address = %first.address, "exchange: a rank left before the list was complete");
                if let Some((contender, _)) = contender {
                    debug!(rank, "exchange: a restarted rank takes its place");
                    self.members[rank] = Some(*contender);
                }
                Ok(())
            }
        }
    }

    /// A contested rank whose first claimant did not answer in time: it is gone (a host that
    /// died, a frozen process), and the contender takes its place.
    fn settle_contests(&mut self, now: Instant) {
        for (rank, slot) in self.members.iter_mut().enumerate() {
            let due = |m: &mut Member| m.contender.as_ref().is_some_and(|(_, t)| now >= *t);
            if let Some(silent) = slot.take_if(due) {
                warn!(rank, address = %silent.address, "exchange: a rank did not answer while another process claimed its rank; replaced");
                *slot = silent.contender.map(|(m, _)| *m);
            }
        }
    }

    /// Records `newcomer` as `rank`; a rank already held is contested (see [`Member`]).
    fn claim(&mut self, rank: usize, newcomer: Member) -> Result<(), ConnectError> {
        let Some(first) = &mut self.members[rank] else {
            self.members[rank] = Some(newcomer);
            return Ok(());
        };
        if let Some((second, _)) = &first.contender {
            // A third claimant: no doubt left.
            let error = ConnectError::DuplicateRank {
                rank,
                first: first.address.to_string(),
                second: second.address.to_string(),
            };
            let message = duplicate_message(first.address, second.address);
            tell(newcomer.stream, &message);
            return Err(error);
        }
        if nonblocking(|| first.stream.write(&[PING])).ok().flatten() != Some(1) {
            debug!(rank, "exchange: a restarted rank takes its place");
            self.members[rank] = Some(newcomer);
            return Ok(());
        }
        first.contender = Some((Box::new(newcomer), Instant::now() + HANDSHAKE_DEADLINE));
        Ok(())
    }

    fn timeout_error(&self) -> ConnectError {
        let mut missing = self.missing();
        let mut detail = String::new();
        if missing.is_empty() {
            // Every rank is in, but two processes still contest some rank.
            missing = (1..self.plan.world)
                .filter(|&r| self.members[r].as_ref().is_some_and(|m| m.contender.is_some()))
                .collect();
            detail = format!(" (which process is rank {missing:?} was never settled)");
        }
        for rank in &missing {
            if let Some(why) = &self.refusals[*rank] {
                detail += &format!("; a connection claiming rank {rank} {why}");
            }
        }
        ConnectError::RendezvousTimeout {
            rendezvous: self.listen_address.clone(),
            missing,
            waited: self.plan.timeout,
            detail,
        }
    }

    /// Tells every waiting rank why rank 0 gave up, and closes their connections.
    fn abandon(&mut self, reason: &str) {
        let message = abort_message(reason);
        for member in self.members.iter_mut().filter_map(Option::take) {
            if let Some((contender, _)) = member.contender {
                tell(contender.stream, &message);
            }
            tell(member.stream, &message);
        }
    }

    /// Looks at every member once more: a rank that died since the last poll is not listed,
    /// the exchange waits on for its next life.
    fn still_complete(&mut self) -> Result<bool, ConnectError> {
        for rank in 1..self.plan.world {
            self.hear(rank)?;
        }
        Ok(self.complete())
    }

    /// Sends the list to every member at once, none waiting on another. A rank that has not
    /// taken it within the handshake deadline is stalled or gone: rank 0 goes on without it
    /// (that rank's ring connect fails and says so) rather than spend the ring's time on it.
    fn send_list(&mut self) -> Result<Vec<SocketAddr>, ConnectError> {
        let until = self.plan.deadline.min(Instant::now() + HANDSHAKE_DEADLINE);
        let mut addresses = vec![self.plan.own];
        addresses.extend(self.members.iter().skip(1).flatten().map(|m| m.address));
        let mut list = vec![LIST];
        for address in &addresses {
            list.extend_from_slice(&encode_address(*address));
        }
        let mut outbox: Vec<(usize, Member, usize)> = self
            .members
            .iter_mut()
            .enumerate()
            .filter_map(|(r, m)| Some((r, m.take()?, 0)))
            .collect();
        loop {
            outbox.retain_mut(|(rank, member, sent)| {
                while *sent < list.len() {
                    match nonblocking(|| member.stream.write(&list[*sent..])) {
                        Ok(Some(n)) if n > 0 => *sent += n,
                        Ok(None) => return true,
                        Ok(Some(_)) | Err(_) => {
                            // Its ring connect will fail and say so; the others go on.
                            warn!(rank, address = %member.address, "could not send the address list");
                            return false;
                        }
                    }
                }
                false
            });
            if outbox.is_empty() {
                break;
            }
            if Instant::now() >= until {
                for (rank, member, _) in &outbox {
                    warn!(rank, address = %member.address, "the address list was not taken in time");
                }
                break;
            }
            let mut fds: Vec<PollFd<'_>> =
                outbox.iter().map(|(_, m, _)| PollFd::new(&m.stream, PollFlags::OUT)).collect();
            poll_wait(&mut fds, Some(until))
                .map_err(|e| ConnectError::io(0, &self.listen_address, &e))?;
        }
        Ok(addresses)
    }
}

/// Reads a proven rank's address as far as it has arrived: `Ok(Some)` once whole, `Err` for a
/// close or an address no rank can connect to.
fn read_address(p: &mut Proven) -> Result<Option<SocketAddr>, &'static str> {
    while p.got < ADDRESS_LEN {
        match nonblocking(|| p.joined.stream.read(&mut p.inbox[p.got..])) {
            Ok(Some(0)) | Err(_) => return Err("closed before sending its address"),
            Ok(Some(n)) => p.got += n,
            Ok(None) => return Ok(None),
        }
    }
    decode_address(&p.inbox).map(Some).ok_or("sent an address no rank can connect to")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::process::Command;

    use silvic_testbed::child::LineChild;

    const CHILD: &str = "launch::exchange::serve::tests::out_of_descriptors_child";

    /// This process's CPU time, user and system, from `stat`, /proc/self/stat opened before
    /// the descriptors ran out.
    fn cpu_time(stat: &std::fs::File) -> Duration {
        use std::os::unix::fs::FileExt;
        let mut bytes = [0u8; 1024];
        let n = stat.read_at(&mut bytes, 0).unwrap();
        let stat = String::from_utf8_lossy(&bytes[..n]);
        // The fields after the command (which may hold spaces) start at its closing paren.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        Duration::from_secs_f64(ticks as f64 / rustix::param::clock_ticks_per_second() as f64)
    }

    /// Finding 3: with every descriptor taken, accept fails at once while the listener stays
    /// readable; rank 0 must rest, not spin. The child process (this test binary again, so
    /// that only it runs out of descriptors) serves, the strangers come from here.
    #[test]
    fn out_of_descriptors_rank_0_rests_instead_of_spinning() {
        let limit = Instant::now() + Duration::from_secs(60);
        let mut command = Command::new(std::env::current_exe().unwrap());
        command.args(["--exact", CHILD, "--ignored", "--nocapture", "--test-threads=1"]);
        command.env("SILVIC_EMFILE_CHILD", "1");
        let mut child = LineChild::spawn("the serving process", command).unwrap();
        let line = child.wait_for(&["PORT "], limit).unwrap().text;
        let port: u16 = line["PORT ".len()..].trim().parse().unwrap();
        // More strangers than the child has descriptors left: the rest wait in its backlog.
        let strangers: Vec<std::net::TcpStream> =
            (0..64).map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
        child.send("flooded").unwrap();
        let line = child.wait_for(&["CPU "], limit).unwrap().text;
        let share: f64 = line["CPU ".len()..].trim().parse().unwrap();
        eprintln!("rank 0 used {:.1}% of a core with no descriptor left", share * 100.0);
        // A spinning loop takes a whole core (80-87% measured on the code before); resting
        // 50 ms between attempts takes well under 1%. A fifth is far from both.
        assert!(share < 0.2, "rank 0 spins out of descriptors: {:.0}% of a core", share * 100.0);
        drop(strangers);
    }

    #[test]
    #[ignore = "the serving process of out_of_descriptors_rank_0_rests_instead_of_spinning"]
    fn out_of_descriptors_child() {
        assert!(std::env::var("SILVIC_EMFILE_CHILD").is_ok(), "started by its parent test");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        println!();
        println!("PORT {}", listener.local_addr().unwrap().port());
        let stat = std::fs::File::open("/proc/self/stat").unwrap();
        // Take every descriptor left, then give back two: room for two strangers only.
        let mut taken = Vec::new();
        while let Ok(file) = std::fs::File::open("/dev/null") {
            taken.push(file);
            assert!(taken.len() < 1 << 20, "no descriptor limit");
        }
        taken.truncate(taken.len() - 2);
        let timeout = Duration::from_secs(30);
        thread_serve(listener, timeout);
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "flooded");
        std::thread::sleep(Duration::from_millis(300)); // the descriptors are gone by now
        let (wall, cpu) = (Instant::now(), cpu_time(&stat));
        std::thread::sleep(Duration::from_secs(2));
        let share = (cpu_time(&stat) - cpu).as_secs_f64() / wall.elapsed().as_secs_f64();
        println!("CPU {share}");
        std::process::exit(0);
    }

    /// Finding 12: a member whose connection closed after the last poll is looked at once more
    /// before the list goes out, and not listed.
    #[test]
    fn a_member_that_left_since_the_last_poll_is_not_listed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let mut far_ends = Vec::new();
        let mut member = |address: &str| {
            far_ends.push(std::net::TcpStream::connect(at).unwrap());
            let (stream, _) = listener.accept().unwrap();
            stream.set_nonblocking(true).unwrap();
            Some(Member::new(stream, address.parse().unwrap()))
        };
        let members = vec![None, member("10.0.0.2:200"), member("10.0.0.3:300")];
        let timeout = Duration::from_secs(30);
        let plan = Serve {
            listener: &listener,
            world: 3,
            own: "10.0.0.1:100".parse().unwrap(),
            token: b"t",
            deadline: Instant::now() + timeout,
            timeout,
        };
        let key = [0u8; 32];
        let admission = Admission {
            token: &key,
            roster: NO_ROSTER,
            world: 3,
            rank: 0,
            peers: None,
            channels: (0, 1),
        };
        let mut server = Server {
            plan: &plan,
            listen_address: at.to_string(),
            lobby: Lobby::admitting(admission, Vec::new()),
            proven: Vec::new(),
            members,
            refusals: vec![None; 3],
            accept_paused_until: None,
            reminder: Reminder::new(Instant::now()),
        };
        assert!(server.complete() && server.still_complete().unwrap());
        drop(far_ends.remove(0)); // rank 1's process ends
        let closed = &server.members[1].as_ref().unwrap().stream;
        let mut fds = [PollFd::new(closed, PollFlags::IN)];
        poll_wait(&mut fds, Some(Instant::now() + Duration::from_secs(10))).unwrap();
        assert!(!fds[0].revents().is_empty(), "the close reached rank 0");
        assert!(server.complete(), "no poll of the members since");
        assert!(!server.still_complete().unwrap());
        assert!(server.members[1].is_none() && server.members[2].is_some());
    }

    const BUDGET_CHILD: &str = "launch::exchange::serve::tests::descriptor_budget_child";
    /// The ranks joining the child's exchange, and the descriptors it has for them: one each.
    const BUDGET_WORLD: usize = 5;

    /// Finding 3: a proven rank costs rank 0 one descriptor, not two (the stream was cloned):
    /// with exactly one descriptor per waiting rank, every rank is listed.
    #[test]
    fn rank_0_needs_one_descriptor_per_waiting_rank() {
        use crate::launch::exchange::{Join, join};
        let limit = Instant::now() + Duration::from_secs(60);
        let mut command = Command::new(std::env::current_exe().unwrap());
        command.args(["--exact", BUDGET_CHILD, "--ignored", "--nocapture", "--test-threads=1"]);
        command.env("SILVIC_BUDGET_CHILD", "1");
        let mut child = LineChild::spawn("the serving process", command).unwrap();
        let line = child.wait_for(&["PORT "], limit).unwrap().text;
        let port: u16 = line["PORT ".len()..].trim().parse().unwrap();
        let server: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let timeout = Duration::from_secs(20);
        let joiners: Vec<_> = (1..BUDGET_WORLD)
            .map(|rank| {
                std::thread::spawn(move || {
                    join(&Join {
                        server,
                        rank,
                        world: BUDGET_WORLD,
                        own: ([10, 0, 0, rank as u8], 100).into(),
                        token: b"t",
                        deadline: Instant::now() + timeout,
                        timeout,
                    })
                })
            })
            .collect();
        for (i, j) in joiners.into_iter().enumerate() {
            let list = j.join().unwrap();
            assert!(list.is_ok(), "rank {}: {list:?}", i + 1);
        }
        let line = child.wait_for(&["SERVED "], limit).unwrap().text;
        assert!(line.starts_with("SERVED Ok"), "{line}");
    }

    #[test]
    #[ignore = "the serving process of rank_0_needs_one_descriptor_per_waiting_rank"]
    fn descriptor_budget_child() {
        assert!(std::env::var("SILVIC_BUDGET_CHILD").is_ok(), "started by its parent test");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        println!();
        println!("PORT {}", listener.local_addr().unwrap().port());
        let mut taken = Vec::new();
        while let Ok(file) = std::fs::File::open("/dev/null") {
            taken.push(file);
            assert!(taken.len() < 1 << 20, "no descriptor limit");
        }
        // One descriptor for each rank that will wait for the list, and none more.
        taken.truncate(taken.len() - (BUDGET_WORLD - 1));
        let timeout = Duration::from_secs(15);
        let served = serve(&Serve {
            listener: &listener,
            world: BUDGET_WORLD,
            own: "10.0.0.0:100".parse().unwrap(),
            token: b"t",
            deadline: Instant::now() + timeout,
            timeout,
        });
        println!("SERVED {served:?}");
        std::process::exit(0);
    }

    fn thread_serve(listener: TcpListener, timeout: Duration) {
        std::thread::spawn(move || {
            let plan = Serve {
                listener: &listener,
                world: 3,
                own: "10.0.0.1:100".parse().unwrap(),
                token: b"t",
                deadline: Instant::now() + timeout,
                timeout,
            };
            let _ = serve(&plan);
        });
    }
}
