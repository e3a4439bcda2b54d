//! Child processes that talk in lines, with bounded waits, killed when dropped.
//!
//! A reader thread forwards each stdout line, stamped with its arrival time, over a channel, so
//! every wait has a deadline and a child that hangs turns into a failed test, never a stuck run.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// One line a child printed, and when it arrived.
#[derive(Debug, Clone)]
pub struct Line {
    /// When the harness read it.
    pub at: Instant,
    /// The text, without the newline.
    pub text: String,
}

/// A running child. Dropping it kills it (SIGCONT first, in case it is stopped) and reaps it.
#[derive(Debug)]
pub struct LineChild {
    /// A name for messages, such as "rank 2".
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Line>,
    /// Every line read so far, in order.
    pub seen: Vec<Line>,
    stderr: Arc<Mutex<String>>,
}

impl LineChild {
    /// Starts `command` with piped stdin and stdout; stderr is kept (the last 64 KiB) for
    /// failure messages.
    pub fn spawn(name: &str, mut command: Command) -> Result<LineChild, String> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{name}: cannot start {command:?}: {e}"))?;
        let (send, lines) = channel();
        let stdout = child.stdout.take().expect("piped");
        thread::spawn(move || {
            for text in BufReader::new(stdout).lines() {
                let Ok(text) = text else { break };
                if send.send(Line { at: Instant::now(), text }).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let (mut err_pipe, keep) = (child.stderr.take().expect("piped"), stderr.clone());
        thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = err_pipe.read(&mut buf) {
                let mut kept = keep.lock().unwrap();
                kept.push_str(&String::from_utf8_lossy(&buf[..n]));
                if kept.len() > 64 << 10 {
                    let cut = kept.len() - (32 << 10);
                    let cut = (cut..kept.len()).find(|&i| kept.is_char_boundary(i)).unwrap_or(0);
                    kept.drain(..cut);
                }
            }
        });
        let stdin = child.stdin.take();
        Ok(LineChild { name: name.into(), child, stdin, lines, seen: Vec::new(), stderr })
    }

    /// The operating system's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the child wrote to stderr (the tail).
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Writes one line to the child's stdin.
    pub fn send(&mut self, line: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or_else(|| format!("{}: stdin closed", self.name))?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("{}: cannot write to stdin: {e}", self.name))
    }

    /// The next line, or `None` when `deadline` passes or the child closed stdout.
    pub fn next_line(&mut self, deadline: Instant) -> Option<Line> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(line) => {
                self.seen.push(line.clone());
                Some(line)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Reads lines until one starts with any of `prefixes`, before `deadline`.
    pub fn wait_for(&mut self, prefixes: &[&str], deadline: Instant) -> Result<Line, String> {
        while let Some(line) = self.next_line(deadline) {
            if prefixes.iter().any(|p| line.text.starts_with(p)) {
                return Ok(line);
            }
        }
        Err(format!(
            "{}: no line starting with {prefixes:?} before the deadline; last lines: {:?}; stderr: {}",
            self.name,
            self.seen.iter().rev().take(5).map(|l| &l.text).collect::<Vec<_>>(),
            self.stderr()
        ))
    }

    /// Sends `signal` to the child.
    pub fn signal(&self, signal: Signal) -> Result<(), String> {
        let pid = Pid::from_raw(self.pid() as i32).ok_or("pid 0")?;
        kill_process(pid, signal).map_err(|e| format!("{}: kill {signal:?}: {e}", self.name))
    }

    /// Waits up to `limit` for the child to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LineChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.signal(Signal::CONT);
            let _ = self.child.kill();
        }
        let _ = self.wait_exit(Duration::from_secs(10));
    }
}
