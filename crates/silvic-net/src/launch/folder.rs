//! The rendezvous folder: ranks learn each other's addresses through a folder every rank sees
//! (a shared file system), with no server.
//!
//! Each rank writes one file, `rank-R`, then waits until all `world` files are there and reads
//! them in rank order: that list is what [`TcpCollective::connect`](crate::TcpCollective::connect)
//! needs.
//!
//! Invariants:
//! - A file is written under a temporary name and renamed, so a reader never sees half of one.
//! - Each file names the world size, so ranks started with different worlds fail at once
//!   instead of waiting out the timeout.
//! - Files left by an earlier run would send ranks to dead addresses, so a rank refuses a folder
//!   that already holds its own file; [`withdraw`] removes it again once every rank has read it.
//! - Nothing read is trusted further than its shape: a file that is not ours is an error naming
//!   it; the job token is proven by the ring handshake that follows, not here.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::ConnectError;
use crate::wait::Backoff;

const MAGIC: &str = "silvic-net rendezvous 1";
/// How often a waiting rank looks at the folder again.
const POLL: Duration = Duration::from_millis(20);
/// The longest file a rank reads: an address is far shorter.
const MAX_FILE: u64 = 512;

fn path(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank-{rank}"))
}

fn folder_error(path: &Path, message: impl Into<String>) -> ConnectError {
    ConnectError::Folder { path: path.display().to_string(), message: message.into() }
}

fn io_error(path: &Path, e: &io::Error) -> ConnectError {
    folder_error(path, e.to_string())
}

/// Writes this rank's `address` into `dir`, refusing a folder that already holds this rank's
/// file (an earlier run's, or another process's that claims the same rank).
pub fn publish(dir: &Path, rank: usize, world: usize, address: &str) -> Result<(), ConnectError> {
    let target = path(dir, rank);
    if target.exists() {
        return Err(folder_error(
            &target,
            format!(
                "already exists: another process claims rank {rank}, or the folder holds an \
                 earlier run's addresses; use an empty folder for each run"
            ),
        ));
    }
    let temporary = dir.join(format!(".rank-{rank}.{}.tmp", std::process::id()));
    let text = format!("{MAGIC}\nworld {world}\naddress {address}\n");
    fs::write(&temporary, text).map_err(|e| io_error(&temporary, &e))?;
    fs::rename(&temporary, &target).map_err(|e| io_error(&target, &e))
}

/// Parses a rank file; returns the address.
fn parse(text: &str, world: usize) -> Result<String, String> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err("not a silvic-net rendezvous file".into());
    }
    let their_world = lines.next().and_then(|l| l.strip_prefix("world ")).ok_or("no world line")?;
    if their_world != world.to_string() {
        return Err(format!("that rank runs in a world of {their_world}, this one of {world}"));
    }
    let address = lines.next().and_then(|l| l.strip_prefix("address ")).ok_or("no address line")?;
    if address.is_empty() || lines.next().is_some() {
        return Err("malformed address line".into());
    }
    Ok(address.to_string())
}

fn read(file: &Path) -> io::Result<String> {
    use io::Read;
    let mut text = String::new();
    fs::File::open(file)?.take(MAX_FILE).read_to_string(&mut text)?;
    Ok(text)
}

/// Waits until every rank's file is in `dir` and returns the addresses in rank order; past
/// `timeout`, an error naming the first rank still missing (and all of them).
pub fn gather(dir: &Path, world: usize, timeout: Duration) -> Result<Vec<String>, ConnectError> {
    let deadline = super::deadline_after(Instant::now(), timeout);
    let mut addresses: Vec<Option<String>> = vec![None; world];
    let mut backoff = Backoff::new((POLL, POLL));
    loop {
        for (rank, slot) in addresses.iter_mut().enumerate().filter(|(_, a)| a.is_none()) {
            let file = path(dir, rank);
            match read(&file) {
                Ok(text) => {
                    *slot = Some(parse(&text, world).map_err(|why| folder_error(&file, why))?)
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(&file, &e)),
            }
        }
        let missing: Vec<usize> = (0..world).filter(|&r| addresses[r].is_none()).collect();
        let Some(&first) = missing.first() else {
            return Ok(addresses.into_iter().flatten().collect());
        };
        if Instant::now() >= deadline {
            return Err(ConnectError::Timeout {
                peer: first,
                address: path(dir, first).display().to_string(),
                waited: timeout,
                waiting_for: format!("to write its address (ranks {missing:?} are missing)"),
            });
        }
        backoff.sleep(deadline);
    }
}

/// Removes this rank's file, once every rank has read it (for one, once the ring is formed and
/// a first collective has passed).
pub fn withdraw(dir: &Path, rank: usize) {
    let _ = fs::remove_file(path(dir, rank));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("silvic-net-folder-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn every_rank_reads_every_address_in_rank_order() {
        let dir = scratch_dir("order");
        for rank in [2, 0, 1] {
            publish(&dir, rank, 3, &format!("127.0.0.1:{}", 1000 + rank)).unwrap();
        }
        let got = gather(&dir, 3, Duration::from_secs(1)).unwrap();
        assert_eq!(got, ["127.0.0.1:1000", "127.0.0.1:1001", "127.0.0.1:1002"]);
        // A second run (or a second claimant of rank 1) is refused until the files are withdrawn.
        let e = publish(&dir, 1, 3, "x:1").unwrap_err();
        assert!(e.to_string().contains("another process claims rank 1"), "{e}");
        for rank in 0..3 {
            withdraw(&dir, rank);
        }
        publish(&dir, 1, 3, "127.0.0.1:9").unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_ranks_time_out_naming_them() {
        let dir = scratch_dir("missing");
        publish(&dir, 0, 3, "127.0.0.1:1").unwrap();
        let e = gather(&dir, 3, Duration::from_millis(50)).unwrap_err();
        assert_eq!(e.peer(), Some(1));
        assert!(e.to_string().contains("ranks [1, 2] are missing"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_rank_of_another_world_or_garbage_fails_at_once() {
        let dir = scratch_dir("world");
        publish(&dir, 0, 2, "127.0.0.1:1").unwrap();
        publish(&dir, 1, 3, "127.0.0.1:2").unwrap();
        let e = gather(&dir, 2, Duration::from_secs(30)).unwrap_err();
        assert!(e.to_string().contains("a world of 3"), "{e}");
        assert!(e.to_string().contains("rank-1"), "{e}");
        assert!(parse("hello\n", 2).is_err());
        assert!(parse(&format!("{MAGIC}\nworld 2\n"), 2).is_err());
        assert!(parse(&format!("{MAGIC}\nworld 2\naddress \n"), 2).is_err());
        assert!(parse(&format!("{MAGIC}\nworld 2\naddress a:1\nmore\n"), 2).is_err());
        assert_eq!(parse(&format!("{MAGIC}\nworld 2\naddress [::1]:5\n"), 2).unwrap(), "[::1]:5");
        fs::remove_dir_all(&dir).unwrap();
    }
}
