//! One handshake's bytes over a non-blocking stream: a whole message out, a whole message in.
//!
//! Invariants: a message is queued only once the previous one is flushed (the handshake is
//! strictly request and answer); partial reads and writes resume where they stopped; nothing
//! is allocated, every buffer is [`MESSAGE_LEN`] bytes. Not here: what the messages mean.

use std::io::{self, Read, Write};
use std::time::Duration;

use rustix::event::PollFlags;

use crate::handshake::{MESSAGE_LEN, Message};
use crate::wait::nonblocking;

/// How long one connection, accepted or dialled, has to complete its handshake.
pub(crate) const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

/// A stream and the message in flight each way.
#[derive(Debug)]
pub(super) struct Conn<S> {
    stream: S,
    inbox: [u8; MESSAGE_LEN],
    got: usize,
    outbox: [u8; MESSAGE_LEN],
    sent: usize,
}

impl<S: Read + Write> Conn<S> {
    /// Wraps a non-blocking stream with nothing queued.
    pub(super) fn new(stream: S) -> Conn<S> {
        Conn {
            stream,
            inbox: [0; MESSAGE_LEN],
            got: 0,
            outbox: [0; MESSAGE_LEN],
            sent: MESSAGE_LEN,
        }
    }

    /// Queues `message`, replacing nothing: call only once [`Conn::flushed`].
    pub(super) fn queue(&mut self, message: &Message) {
        debug_assert!(self.flushed(), "a message queued over an unsent one");
        self.outbox = message.encode();
        self.sent = 0;
    }

    /// Whether the queued message has been written whole.
    pub(super) fn flushed(&self) -> bool {
        self.sent == MESSAGE_LEN
    }

    /// Writes as much of the queued message as the stream takes now.
    pub(super) fn flush(&mut self) -> io::Result<()> {
        while !self.flushed() {
            match nonblocking(|| self.stream.write(&self.outbox[self.sent..]))? {
                Some(0) => return Err(io::ErrorKind::WriteZero.into()),
                Some(n) => self.sent += n,
                None => break,
            }
        }
        Ok(())
    }

    /// The next whole message, if it has arrived; a close is `UnexpectedEof`.
    pub(super) fn receive(&mut self) -> io::Result<Option<[u8; MESSAGE_LEN]>> {
        while self.got < MESSAGE_LEN {
            match nonblocking(|| self.stream.read(&mut self.inbox[self.got..]))? {
                Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Some(n) => self.got += n,
                None => return Ok(None),
            }
        }
        self.got = 0;
        Ok(Some(self.inbox))
    }

    /// Sends a last message if it fits now, without waiting: a refusal is best effort.
    pub(super) fn send_last(&mut self, message: Option<Message>) {
        if let Some(m) = message {
            if self.flushed() {
                self.queue(&m);
                let _ = self.flush();
            }
        }
    }
}

impl<S> Conn<S> {
    /// What to poll for: writable while a message is unsent, else readable.
    pub(super) fn events(&self) -> PollFlags {
        if self.sent == MESSAGE_LEN { PollFlags::IN } else { PollFlags::OUT }
    }

    /// The stream, for polling.
    pub(super) fn stream(&self) -> &S {
        &self.stream
    }

    /// The stream, once the handshake is over.
    pub(super) fn into_stream(self) -> S {
        self.stream
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;
    use crate::handshake::{Connector, MessageKind};

    fn pair() -> (Conn<UnixStream>, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        (Conn::new(a), b)
    }

    fn hello(rank: u32) -> Message {
        Connector::start(b"t", [0; 32], 9, rank, rank + 1, [0; 16]).1
    }

    #[test]
    fn a_message_arriving_in_pieces_is_returned_once_whole() {
        let (mut conn, mut other) = pair();
        let bytes = hello(3).encode();
        assert!(conn.receive().unwrap().is_none());
        other.write_all(&bytes[..10]).unwrap();
        assert!(conn.receive().unwrap().is_none());
        other.write_all(&bytes[10..]).unwrap();
        assert_eq!(conn.receive().unwrap(), Some(bytes));
        assert!(conn.receive().unwrap().is_none(), "the next message starts empty");
        drop(other);
        assert_eq!(conn.receive().unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_queued_message_is_written_whole_and_polled_for_writing_until_then() {
        let (mut conn, mut other) = pair();
        assert_eq!(conn.events(), PollFlags::IN);
        conn.queue(&hello(7));
        assert!(!conn.flushed());
        assert_eq!(conn.events(), PollFlags::OUT);
        conn.flush().unwrap();
        assert!(conn.flushed());
        let mut got = [0u8; MESSAGE_LEN];
        other.read_exact(&mut got).unwrap();
        let got = Message::decode(&got).unwrap();
        assert_eq!((got.kind, got.rank), (MessageKind::Hello, 7));
    }
}
