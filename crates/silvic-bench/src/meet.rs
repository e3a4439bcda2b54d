//! The rendezvous folder: how the ranks of a multi-host run learn each other's addresses.
//!
//! Each rank writes one file, `rank-R`, into a folder every rank sees (a shared file system),
//! then waits until all `world` files are there and reads them in rank order: that list is what
//! [`silvic_net::TcpCollective::connect`] needs. A file is written under a temporary name and
//! renamed, so a reader never sees half of one. Each file also names the world size, so ranks
//! started with different `--world` fail at once instead of waiting out the timeout.
//!
//! Files left by an earlier run would send ranks to dead addresses, so a rank refuses a folder
//! that already holds its own file; after the ring is formed each rank removes its file again.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MAGIC: &str = "silvic-bench rendezvous 1";
/// How often a waiting rank looks at the folder again.
const POLL: Duration = Duration::from_millis(20);

fn path(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank-{rank}"))
}

/// What went wrong in the folder.
#[derive(Debug)]
pub(crate) enum MeetError {
    /// Reading or writing the folder failed.
    Io(PathBuf, io::Error),
    /// This rank's file is there already: the folder was used before.
    Stale(PathBuf),
    /// A rank's file does not say what it should.
    Bad(PathBuf, String),
    /// Some ranks never wrote their file.
    Timeout(Vec<usize>, Duration),
}

impl std::fmt::Display for MeetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MeetError::Io(p, e) => write!(f, "rendezvous folder: {}: {e}", p.display()),
            MeetError::Stale(p) => write!(
                f,
                "{} already exists: the rendezvous folder holds an earlier run's addresses; \
                 use an empty folder for each run",
                p.display()
            ),
            MeetError::Bad(p, why) => write!(f, "{}: {why}", p.display()),
            MeetError::Timeout(missing, t) => {
                write!(f, "ranks {missing:?} did not write their address within {t:?}")
            }
        }
    }
}

impl std::error::Error for MeetError {}

/// Writes this rank's address into `dir`.
pub(crate) fn publish(
    dir: &Path,
    rank: usize,
    world: usize,
    address: &str,
) -> Result<(), MeetError> {
    let target = path(dir, rank);
    if target.exists() {
        return Err(MeetError::Stale(target));
    }
    let temporary = dir.join(format!(".rank-{rank}.{}.tmp", std::process::id()));
    let text = format!("{MAGIC}\nworld {world}\naddress {address}\n");
    fs::write(&temporary, text).map_err(|e| MeetError::Io(temporary.clone(), e))?;
    fs::rename(&temporary, &target).map_err(|e| MeetError::Io(target, e))
}

/// Parses a rank file; returns the address.
fn parse(text: &str, world: usize) -> Result<String, String> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err("not a silvic-bench rendezvous file".into());
    }
    let their_world = lines.next().and_then(|l| l.strip_prefix("world ")).ok_or("no world line")?;
    if their_world != world.to_string() {
        return Err(format!("that rank runs with --world {their_world}, this one with {world}"));
    }
    let address = lines.next().and_then(|l| l.strip_prefix("address ")).ok_or("no address line")?;
    if address.is_empty() || lines.next().is_some() {
        return Err("malformed address line".into());
    }
    Ok(address.to_string())
}

/// Waits until every rank's file is in `dir` and returns the addresses in rank order.
pub(crate) fn gather(
    dir: &Path,
    world: usize,
    timeout: Duration,
) -> Result<Vec<String>, MeetError> {
    let deadline = Instant::now() + timeout;
    let mut addresses: Vec<Option<String>> = vec![None; world];
    loop {
        for (rank, slot) in addresses.iter_mut().enumerate().filter(|(_, a)| a.is_none()) {
            let file = path(dir, rank);
            match fs::read_to_string(&file) {
                Ok(text) => {
                    *slot = Some(parse(&text, world).map_err(|why| MeetError::Bad(file, why))?)
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(MeetError::Io(file, e)),
            }
        }
        let missing: Vec<usize> = (0..world).filter(|&r| addresses[r].is_none()).collect();
        if missing.is_empty() {
            return Ok(addresses.into_iter().flatten().collect());
        }
        if Instant::now() >= deadline {
            return Err(MeetError::Timeout(missing, timeout));
        }
        std::thread::sleep(POLL);
    }
}

/// Removes this rank's file, once every rank has read it.
pub(crate) fn withdraw(dir: &Path, rank: usize) {
    let _ = fs::remove_file(path(dir, rank));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("silvic-bench-meet-{name}-{}", std::process::id()));
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
        // A second run in the same folder is refused until the files are withdrawn.
        assert!(matches!(publish(&dir, 1, 3, "x:1"), Err(MeetError::Stale(_))));
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
        assert!(matches!(&e, MeetError::Timeout(m, _) if m == &[1, 2]), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_rank_of_another_world_or_garbage_fails_at_once() {
        let dir = scratch_dir("world");
        publish(&dir, 0, 2, "127.0.0.1:1").unwrap();
        publish(&dir, 1, 3, "127.0.0.1:2").unwrap();
        let e = gather(&dir, 2, Duration::from_secs(30)).unwrap_err();
        assert!(e.to_string().contains("--world 3"), "{e}");
        assert!(parse("hello\n", 2).is_err());
        assert!(parse(&format!("{MAGIC}\nworld 2\n"), 2).is_err());
        assert!(parse(&format!("{MAGIC}\nworld 2\naddress \n"), 2).is_err());
        assert!(parse(&format!("{MAGIC}\nworld 2\naddress a:1\nmore\n"), 2).is_err());
        assert_eq!(parse(&format!("{MAGIC}\nworld 2\naddress [::1]:5\n"), 2).unwrap(), "[::1]:5");
        fs::remove_dir_all(&dir).unwrap();
    }
}
