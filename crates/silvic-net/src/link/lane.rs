//! One lane of a step as the link drives it: the frame going out ([`Outgoing`]), the frame
//! coming in ([`Flow`]), and a read that counts its bytes ([`Counted`]).

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;

use crate::frame::{HEADER_LEN, Header};
use crate::ring::{Lane, Sink};

use super::reader::Incoming;

/// The frame being written to one neighbour.
pub(super) struct Outgoing<'a> {
    pub(super) head: [u8; HEADER_LEN],
    pub(super) payload: &'a [u8],
    pub(super) sent: usize,
}

impl<'a> Outgoing<'a> {
    pub(super) fn new(header: &Header, payload: &'a [u8]) -> Self {
        Outgoing { head: header.encode(), payload, sent: 0 }
    }
    /// Nothing to send: a step without this lane.
    pub(super) fn none() -> Self {
        Outgoing { head: [0; HEADER_LEN], payload: &[], sent: HEADER_LEN }
    }
    pub(super) fn len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }
    pub(super) fn done(&self) -> bool {
        self.sent == self.len()
    }

    /// Writes what `stream` takes now, header and payload in one vectored write, counting the
    /// bytes in `sent_bytes`; returns whether a byte moved.
    pub(super) fn write_to(
        &mut self,
        mut stream: &TcpStream,
        sent_bytes: &mut u64,
    ) -> io::Result<bool> {
        let mut moved = false;
        while !self.done() {
            let written = if self.sent < HEADER_LEN {
                let parts = [IoSlice::new(&self.head[self.sent..]), IoSlice::new(self.payload)];
                stream.write_vectored(&parts)
            } else {
                stream.write(&self.payload[self.sent - HEADER_LEN..])
            };
            match written {
                Ok(n) => {
                    self.sent += n;
                    *sent_bytes += n as u64;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(moved)
    }
}

/// One lane of a step, as the link drives it: the frame going out, the frame coming in.
pub(super) struct Flow<'a> {
    pub(super) out: Outgoing<'a>,
    pub(super) incoming: Incoming,
    pub(super) expect: Header,
    /// `None` on a lane that receives nothing.
    pub(super) sink: Option<&'a mut dyn Sink>,
}

impl<'a> Flow<'a> {
    pub(super) fn new(lane: Lane<'a>) -> Self {
        Flow {
            out: Outgoing::new(&lane.header, lane.payload),
            incoming: Incoming::new(),
            expect: lane.expect,
            sink: Some(lane.sink),
        }
    }
}

/// A stream read that counts what it reads.
pub(super) struct Counted<'a> {
    pub(super) stream: &'a TcpStream,
    pub(super) bytes: &'a mut u64,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.stream.read(buf)?;
        *self.bytes += n as u64;
        Ok(n)
    }
}
