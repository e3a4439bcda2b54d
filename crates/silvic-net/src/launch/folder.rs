//! The rendezvous folder: ranks learn each other's addresses through a folder every rank sees
//! (a shared file system), with no server.
//!
//! Each rank writes one file, `rank-R`, then waits until all `world` files of its job are there
//! and reads them in rank order: that list is what
//! [`TcpCollective::connect`](crate::TcpCollective::connect) needs.
//!
//! ```text
//!  silvic-net rendezvous 2
//!  job 3f1c...            16 bytes of HMAC-SHA256(job token, "silvic-net folder job"), hex
//!  rank 1
//!  world 4
//!  address 10.0.0.2:29500
//!  mac 9a0e...            HMAC-SHA256(job token, "silvic-net folder file" | the lines above)
//! ```
//!
//! Invariants:
//! - The folder is opened once ([`Folder::open`]: `O_DIRECTORY | O_NOFOLLOW`, so a symlink at
//!   its name is refused) and every later step works relative to what was opened, so the owner
//!   and mode checked are those of the folder written and read, whatever happens to the path.
//! - The folder is this user's and writable by no one else: one this rank creates is made
//!   0700; one owned by another user, or writable by others, is refused with the fix.
//! - A file is written under a fresh random name (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600:
//!   nothing planted there is followed or overwritten) and claimed with a hard link to
//!   `rank-R`, which fails if that name exists: of two processes claiming one rank, exactly one
//!   succeeds.
//! - Rank files are opened without following a symlink and without blocking (a FIFO cannot
//!   hold a rank), and read only if they are regular files of at most [`MAX_FILE`] bytes.
//! - A file of another job (another token: an earlier run's, another user's experiment) or one
//!   whose MAC does not verify is ignored, never dialled; the timeout names what was ignored.
//!   A file of this job with another world size fails at once: ranks started with different
//!   worlds do not wait out the timeout. A file of this job for the rank this one claims
//!   (an earlier run with the same token, or another process) is refused.
//! - [`Folder::withdraw`] removes this rank's file once every rank has read it.
//! - Nothing in the files is secret: the job identity and the MACs are derived from the token
//!   one way; the token never leaves the process.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use rustix::fs::{AtFlags, CWD, Mode, OFlags};
use rustix::io::Errno;
use sha2::Sha256;

use crate::error::ConnectError;
use crate::wait::{Backoff, Reminder};

const MAGIC: &str = "silvic-net rendezvous 2";
const JOB_LABEL: &[u8] = b"silvic-net folder job";
const FILE_LABEL: &[u8] = b"silvic-net folder file";
/// How often a waiting rank looks at the folder again.
const POLL: Duration = Duration::from_millis(20);
/// The longest file a rank reads: a whole valid one is under 300 bytes.
pub const MAX_FILE: u64 = 512;

/// Rank `rank`'s file name.
fn name(rank: usize) -> String {
    format!("rank-{rank}")
}

fn folder_error(path: &Path, message: impl Into<String>) -> ConnectError {
    ConnectError::Folder { path: path.display().to_string(), message: message.into() }
}

fn io_error(path: &Path, e: &io::Error) -> ConnectError {
    folder_error(path, e.to_string())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn keyed(token: &[u8], label: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(token).expect("HMAC takes keys of any length");
    mac.update(label);
    mac
}

/// The job's public identity: files of other jobs in the same folder are told apart by it.
fn job_identity(token: &[u8]) -> String {
    hex(&keyed(token, JOB_LABEL).finalize().into_bytes()[..16])
}

/// The file's text up to its MAC line, and the MAC line.
fn body(token: &[u8], rank: usize, world: usize, address: &str) -> String {
    let job = job_identity(token);
    format!("{MAGIC}\njob {job}\nrank {rank}\nworld {world}\naddress {address}\n")
}

fn mac_of(token: &[u8], body: &str) -> String {
    let mut mac = keyed(token, FILE_LABEL);
    mac.update(body.as_bytes());
    hex(&mac.finalize().into_bytes())
}

/// The rendezvous folder, opened once: every later step works on what was opened and checked,
/// relative to it, so the path cannot be swapped for another folder (a symlink, a rename) once
/// its owner and mode were checked.
#[derive(Debug)]
pub struct Folder {
    /// The folder itself, opened `O_DIRECTORY | O_NOFOLLOW`.
    fd: OwnedFd,
    /// Its path, for messages only.
    path: PathBuf,
}

impl Folder {
    /// Creates `dir` (0700) if it is missing, opens it without following a symlink at its
    /// name, and refuses one another user owns or others may write to: anyone who can write
    /// there can make ranks dial their address or fail.
    pub fn open(dir: &Path) -> Result<Folder, ConnectError> {
        match fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) => return Err(io_error(dir, &e)),
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(CWD, dir, flags, Mode::empty()).map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR if is_symlink(dir) => folder_error(
                dir,
                "a symbolic link: give the folder's own path (a link there could be pointed \
                 elsewhere between the ranks' checks)",
            ),
            Errno::NOTDIR => folder_error(dir, "not a folder"),
            e => io_error(dir, &e.into()),
        })?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| io_error(dir, &e.into()))?;
        let me = rustix::process::geteuid().as_raw();
        if stat.st_uid != me {
            return Err(folder_error(
                dir,
                format!(
                    "owned by user {}, not this process's {me}: anyone who can write there can \
                     misdirect the ranks; use a folder of your own",
                    stat.st_uid
                ),
            ));
        }
        let mode = stat.st_mode & 0o7777;
        if mode & 0o022 != 0 {
            return Err(folder_error(
                dir,
                format!(
                    "mode {mode:04o} lets other users write there, and so misdirect the ranks; \
                     use a folder only you can write to (chmod 700)"
                ),
            ));
        }
        Ok(Folder { fd, path: dir.to_path_buf() })
    }

    /// Where rank `rank`'s file is, for messages.
    fn path_of(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Writes this rank's `address`, signed with the job `token`; refuses when `rank-R` is
    /// already there (another process claims this rank, or the folder holds an earlier run's
    /// file).
    pub fn publish(
        &self,
        rank: usize,
        world: usize,
        address: &str,
        token: &[u8],
    ) -> Result<(), ConnectError> {
        let target = name(rank);
        let body = body(token, rank, world, address);
        let text = format!("{body}mac {}\n", mac_of(token, &body));
        let mut suffix = [0u8; 8];
        getrandom::fill(&mut suffix)
            .map_err(|e| folder_error(&self.path, format!("no random bytes: {e}")))?;
        let temporary = format!(".rank-{rank}.{}.tmp", hex(&suffix));
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let written = rustix::fs::openat(&self.fd, &temporary, flags, Mode::RUSR | Mode::WUSR)
            .map_err(io::Error::from)
            .and_then(|fd| fs::File::from(fd).write_all(text.as_bytes()));
        if let Err(e) = written {
            let _ = rustix::fs::unlinkat(&self.fd, &temporary, AtFlags::empty());
            return Err(io_error(&self.path_of(&temporary), &e));
        }
        // The claim: a hard link fails if the name exists, so one process wins a rank.
        let claimed = rustix::fs::linkat(&self.fd, &temporary, &self.fd, &target, AtFlags::empty());
        let _ = rustix::fs::unlinkat(&self.fd, &temporary, AtFlags::empty());
        let target_path = self.path_of(&target);
        match claimed {
            Ok(()) => Ok(()),
            Err(Errno::EXIST) => {
                let whose = match self
                    .read(&target)
                    .map(|text| check(&text, token, Some(rank), world))
                {
                    Ok(Ok(_)) | Ok(Err(Verdict::OtherWorld(_))) => "another process of this job \
                        claims it, or an earlier run with the same token left it"
                        .to_string(),
                    Ok(Err(Verdict::Ignored(why))) => format!("it holds {why}"),
                    Err(e) => e.to_string(),
                };
                Err(folder_error(
                    &target_path,
                    format!(
                        "already exists ({whose}); each rank must be started once, and each \
                         run needs an empty folder (or one its earlier runs withdrew from)"
                    ),
                ))
            }
            Err(e) => Err(io_error(&target_path, &e.into())),
        }
    }

    /// Reads a rank file: a regular file, not followed through a symlink, opened without
    /// blocking (a FIFO), at most [`MAX_FILE`] bytes.
    fn read(&self, name: &str) -> io::Result<String> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let mut opened = fs::File::from(rustix::fs::openat(&self.fd, name, flags, Mode::empty())?);
        let meta = opened.metadata()?;
        if !meta.file_type().is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        if meta.len() > MAX_FILE {
            return Err(io::Error::other(format!(
                "{} bytes, more than a rank file's {MAX_FILE}",
                meta.len()
            )));
        }
        let mut bytes = Vec::with_capacity(MAX_FILE as usize);
        (&mut opened).take(MAX_FILE + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MAX_FILE {
            return Err(io::Error::other(format!("more than a rank file's {MAX_FILE} bytes")));
        }
        String::from_utf8(bytes).map_err(|_| io::Error::other("not text"))
    }

    /// Waits until every rank's file of this job is in the folder and returns the addresses in
    /// rank order; past `timeout`, an error naming the first rank still missing (and all of
    /// them, and what was ignored in their place).
    pub fn gather(
        &self,
        world: usize,
        token: &[u8],
        timeout: Duration,
    ) -> Result<Vec<String>, ConnectError> {
        let started = Instant::now();
        let deadline = crate::wait::deadline_after(started, timeout);
        let mut reminder = Reminder::new(started);
        let mut addresses: Vec<Option<String>> = vec![None; world];
        let mut ignored: Vec<Option<String>> = vec![None; world];
        let mut backoff = Backoff::new((POLL, POLL));
        loop {
            for (rank, slot) in addresses.iter_mut().enumerate().filter(|(_, a)| a.is_none()) {
                let file = name(rank);
                let why = match self.read(&file) {
                    Ok(text) => match check(&text, token, Some(rank), world) {
                        Ok(address) => {
                            *slot = Some(address);
                            continue;
                        }
                        Err(Verdict::OtherWorld(why)) => {
                            return Err(folder_error(&self.path_of(&file), why));
                        }
                        Err(Verdict::Ignored(why)) => why,
                    },
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => e.to_string(),
                };
                if ignored[rank].as_ref() != Some(&why) {
                    let file = self.path_of(&file);
                    tracing::warn!(file = %file.display(), %why, "rendezvous folder: ignored a rank file");
                    ignored[rank] = Some(why);
                }
            }
            let missing: Vec<usize> = (0..world).filter(|&r| addresses[r].is_none()).collect();
            if missing.is_empty() {
                return Ok(addresses.into_iter().flatten().collect());
            }
            let now = Instant::now();
            let mut detail = String::new();
            for &rank in &missing {
                if let Some(why) = &ignored[rank] {
                    detail += &format!("; rank-{rank} was ignored: {why}");
                }
            }
            if let Some(waited) = reminder.due(now) {
                tracing::warn!(
                    "rendezvous folder {}: waited {} s for ranks {missing:?}{detail}; check \
                     that those ranks are running, with the same folder, world size and job \
                     token",
                    self.path.display(),
                    waited.as_secs()
                );
            }
            if now >= deadline {
                return Err(ConnectError::RendezvousTimeout {
                    rendezvous: self.path.display().to_string(),
                    missing,
                    waited: timeout,
                    detail,
                });
            }
            if crate::cancel::cancelled(None) {
                return Err(ConnectError::Cancelled);
            }
            let gap = backoff.next_gap();
            crate::cancel::sleep(gap.min(deadline.saturating_duration_since(Instant::now())));
        }
    }

    /// Removes this rank's file, once every rank has read it (for one, once the ring is formed
    /// and a first collective has passed).
    pub fn withdraw(&self, rank: usize) {
        let _ = rustix::fs::unlinkat(&self.fd, name(rank), AtFlags::empty());
    }
}

/// Whether `path` names a symbolic link (for the message of a folder that is one).
fn is_symlink(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Why a file is not a rank's address.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Not this job's (another token, a forgery, garbage): passed over, and said why.
    Ignored(String),
    /// This job's, for a world of this size: the ranks were started inconsistently.
    OtherWorld(String),
}

/// Checks a rank file against this job; returns the address.
fn check(text: &str, token: &[u8], rank: Option<usize>, world: usize) -> Result<String, Verdict> {
    let ignored = |why: &str| Verdict::Ignored(why.to_string());
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err(ignored("no silvic-net rendezvous file (of this version)"));
    }
    let mut field = |name: &str| {
        lines.next().and_then(|l| l.strip_prefix(name)?.strip_prefix(' ')).map(str::to_string)
    };
    let (job, their_rank, their_world, address, mac) =
        (field("job"), field("rank"), field("world"), field("address"), field("mac"));
    let (Some(job), Some(their_rank), Some(their_world), Some(address), Some(mac)) =
        (job, their_rank, their_world, address, mac)
    else {
        return Err(ignored("a malformed rendezvous file"));
    };
    if lines.next().is_some() || address.is_empty() {
        return Err(ignored("a malformed rendezvous file"));
    }
    if job != job_identity(token) {
        return Err(ignored("the address of another job (another SILVIC_JOB_TOKEN)"));
    }
    let signed = text.rfind("\nmac ").map_or(0, |at| at + 1);
    if mac_of(token, &text[..signed]) != mac {
        return Err(ignored(
            "a file of this job whose MAC does not verify (not written by a rank)",
        ));
    }
    if rank.is_some_and(|r| their_rank != r.to_string()) {
        return Err(ignored("another rank's address"));
    }
    if their_world != world.to_string() {
        return Err(Verdict::OtherWorld(format!(
            "that rank runs in a world of {their_world}, this one of {world}"
        )));
    }
    Ok(address)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::mpsc;

    const TOKEN: &[u8] = b"a-folder-test-token";

    // Each step on a folder opened afresh, as separate processes would.
    fn prepare(dir: &Path) -> Result<(), ConnectError> {
        Folder::open(dir).map(drop)
    }

    fn publish(
        dir: &Path,
        rank: usize,
        world: usize,
        address: &str,
        token: &[u8],
    ) -> Result<(), ConnectError> {
        Folder::open(dir)?.publish(rank, world, address, token)
    }

    fn gather(
        dir: &Path,
        world: usize,
        token: &[u8],
        timeout: Duration,
    ) -> Result<Vec<String>, ConnectError> {
        Folder::open(dir)?.gather(world, token, timeout)
    }

    fn withdraw(dir: &Path, rank: usize) {
        Folder::open(dir).unwrap().withdraw(rank);
    }

    fn path(dir: &Path, rank: usize) -> PathBuf {
        dir.join(name(rank))
    }

    fn scratch_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("silvic-net-folder-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        prepare(&dir).unwrap();
        dir
    }

    /// Runs `gather` in a thread and waits for it at most `bound`: a gather that blocks (on a
    /// FIFO, say) fails the test instead of hanging it.
    fn gather_within(
        dir: &Path,
        world: usize,
        timeout: Duration,
        bound: Duration,
    ) -> Result<Vec<String>, ConnectError> {
        let (tx, rx) = mpsc::channel();
        let dir = dir.to_path_buf();
        std::thread::spawn(move || tx.send(gather(&dir, world, TOKEN, timeout)));
        rx.recv_timeout(bound).expect("gather returns by its timeout")
    }

    #[test]
    fn every_rank_reads_every_address_in_rank_order() {
        let dir = scratch_dir("order");
        for rank in [2, 0, 1] {
            publish(&dir, rank, 3, &format!("127.0.0.1:{}", 1000 + rank), TOKEN).unwrap();
        }
        let got = gather(&dir, 3, TOKEN, Duration::from_secs(1)).unwrap();
        assert_eq!(got, ["127.0.0.1:1000", "127.0.0.1:1001", "127.0.0.1:1002"]);
        // A second run (or a second claimant of rank 1) is refused until the files are withdrawn.
        let e = publish(&dir, 1, 3, "x:1", TOKEN).unwrap_err();
        assert!(e.to_string().contains("another process of this job claims it"), "{e}");
        for rank in 0..3 {
            withdraw(&dir, rank);
        }
        publish(&dir, 1, 3, "127.0.0.1:9", TOKEN).unwrap();
        let leftovers: Vec<_> =
            fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers, ["rank-1"], "no temporary file is left behind");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_ranks_time_out_naming_them() {
        let dir = scratch_dir("missing");
        publish(&dir, 0, 3, "127.0.0.1:1", TOKEN).unwrap();
        let e = gather(&dir, 3, TOKEN, Duration::from_millis(50)).unwrap_err();
        assert_eq!((e.kind(), e.peer(), e.address()), ("timeout", Some(1), None));
        assert!(e.to_string().contains("ranks [1, 2] never gave their addresses"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_rank_of_another_world_fails_at_once_and_garbage_is_passed_over() {
        let dir = scratch_dir("world");
        publish(&dir, 0, 2, "127.0.0.1:1", TOKEN).unwrap();
        publish(&dir, 1, 3, "127.0.0.1:2", TOKEN).unwrap();
        let e = gather(&dir, 2, TOKEN, Duration::from_secs(30)).unwrap_err();
        assert!(e.to_string().contains("a world of 3"), "{e}");
        assert!(e.to_string().contains("rank-1"), "{e}");
        // One garbage file fails no rank: it is named when the wait ends.
        fs::write(path(&dir, 1), "hello\n").unwrap();
        let e = gather(&dir, 2, TOKEN, Duration::from_millis(100)).unwrap_err();
        assert!(e.to_string().contains("rank-1 was ignored: no silvic-net rendezvous"), "{e}");
        let good = body(TOKEN, 1, 2, "[::1]:5");
        let good = format!("{good}mac {}\n", mac_of(TOKEN, &good));
        assert_eq!(check(&good, TOKEN, Some(1), 2).unwrap(), "[::1]:5");
        for bad in [
            good.replace("address [::1]:5", "address [::1]:6"),
            good.replace("mac ", "mac 0"),
            format!("{good}more\n"),
            good.replace("address [::1]:5\n", ""),
        ] {
            assert!(matches!(check(&bad, TOKEN, Some(1), 2), Err(Verdict::Ignored(_))), "{bad}");
        }
        assert!(matches!(check(&good, TOKEN, Some(2), 2), Err(Verdict::Ignored(_))));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Finding 4: a FIFO or a symlink at a rank's name is not followed, read or waited on.
    #[test]
    fn a_fifo_or_a_symlink_at_a_ranks_name_is_passed_over_without_blocking() {
        let dir = scratch_dir("fifo");
        publish(&dir, 0, 3, "127.0.0.1:1", TOKEN).unwrap();
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            path(&dir, 1),
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        )
        .unwrap();
        // A valid file of this job elsewhere, linked in as rank 2.
        let elsewhere = scratch_dir("fifo-elsewhere");
        publish(&elsewhere, 2, 3, "127.0.0.1:3", TOKEN).unwrap();
        std::os::unix::fs::symlink(path(&elsewhere, 2), path(&dir, 2)).unwrap();
        let timeout = Duration::from_millis(300);
        let e = gather_within(&dir, 3, timeout, Duration::from_secs(20)).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("ranks [1, 2] never gave their addresses"), "{text}");
        assert!(text.contains("rank-1 was ignored: not a regular file"), "{text}");
        assert!(text.contains("rank-2 was ignored"), "{text}");
        fs::remove_dir_all(&dir).unwrap();
        fs::remove_dir_all(&elsewhere).unwrap();
    }

    /// Finding 4: a link planted where the temporary file goes is never written through.
    #[test]
    fn a_link_planted_at_a_temporary_name_is_not_written_through() {
        let dir = scratch_dir("planted");
        let victim = dir.join("victim");
        fs::write(&victim, "precious\n").unwrap();
        // The name the temporary file used to have, and any a guesser might try.
        for name in [format!(".rank-1.{}.tmp", std::process::id()), ".rank-1.tmp".into()] {
            std::os::unix::fs::symlink(&victim, dir.join(name)).unwrap();
        }
        publish(&dir, 1, 2, "127.0.0.1:2", TOKEN).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Finding 4: a folder others can write to, or another user's, is refused with the fix.
    #[test]
    fn a_folder_others_can_write_to_or_another_users_is_refused() {
        let dir = scratch_dir("mode");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let e = publish(&dir, 0, 2, "127.0.0.1:1", TOKEN).unwrap_err();
        assert!(e.to_string().contains("mode 0777 lets other users write there"), "{e}");
        assert!(e.to_string().contains("chmod 700"), "{e}");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let created = dir.join("made-here");
        prepare(&created).unwrap();
        assert_eq!(fs::metadata(&created).unwrap().permissions().mode() & 0o777, 0o700);
        let theirs = if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(&created, Some(65534), Some(65534)).unwrap();
            created.clone()
        } else {
            PathBuf::from("/") // root's
        };
        let e = publish(&theirs, 0, 2, "127.0.0.1:1", TOKEN).unwrap_err();
        assert!(e.to_string().contains("not this process's"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Finding 10 of the second review: the path was checked, then followed again at every
    /// step, so swapping the folder for another (a rename, a symlink) after the check sent
    /// the ranks' files there. The folder opened is the folder used; and a symlink at the
    /// folder's own name is refused.
    #[test]
    fn the_folder_opened_is_the_folder_used_whatever_happens_to_its_path() {
        let dir = scratch_dir("swap");
        let elsewhere = scratch_dir("swap-elsewhere");
        let folder = Folder::open(&dir).unwrap();
        // The path now leads elsewhere: the folder moved, and a link took its name.
        let moved = dir.with_extension("moved");
        let _ = fs::remove_dir_all(&moved);
        fs::rename(&dir, &moved).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        folder.publish(0, 1, "127.0.0.1:1", TOKEN).unwrap();
        assert!(path(&moved, 0).exists(), "the file went where the folder is");
        assert!(!path(&elsewhere, 0).exists(), "the file followed the path");
        assert_eq!(folder.gather(1, TOKEN, Duration::from_millis(50)).unwrap(), ["127.0.0.1:1"]);
        folder.withdraw(0);
        assert!(!path(&moved, 0).exists());
        // A link at the folder's name is refused when opened.
        let e = Folder::open(&dir).unwrap_err().to_string();
        assert!(e.contains("a symbolic link: give the folder's own path"), "{e}");
        fs::remove_file(&dir).unwrap();
        fs::remove_dir_all(&moved).unwrap();
        fs::remove_dir_all(&elsewhere).unwrap();
    }

    const CLAIM_CHILD: &str = "launch::folder::tests::claim_child";

    /// Finding 5: of two processes claiming one rank at the same moment, exactly one succeeds.
    /// Processes, not threads: two threads of one process shared the old temporary name.
    #[test]
    fn of_two_processes_claiming_one_rank_at_once_exactly_one_succeeds() {
        use silvic_testbed::child::LineChild;
        let dir = scratch_dir("race");
        let limit = Instant::now() + Duration::from_secs(120);
        for round in 0..20 {
            let mut claimants: Vec<LineChild> = (0..2)
                .map(|i| {
                    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
                    command.args(["--exact", CLAIM_CHILD, "--ignored", "--nocapture"]);
                    command
                        .env("SILVIC_FOLDER_CLAIM", &dir)
                        .env("SILVIC_FOLDER_PORT", format!("{}", 100 + i));
                    let mut child = LineChild::spawn("a claimant", command).unwrap();
                    child.wait_for(&["READY"], limit).unwrap();
                    child
                })
                .collect();
            for c in &mut claimants {
                c.send("go").unwrap();
            }
            let outcomes: Vec<String> = claimants
                .iter_mut()
                .map(|c| c.wait_for(&["OK", "ERR"], limit).unwrap().text)
                .collect();
            let won = outcomes.iter().filter(|o| o.starts_with("OK")).count();
            assert_eq!(won, 1, "round {round}: {outcomes:?}");
            withdraw(&dir, 1);
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[ignore = "a claimant of of_two_processes_claiming_one_rank_at_once_exactly_one_succeeds"]
    fn claim_child() {
        let dir = PathBuf::from(std::env::var("SILVIC_FOLDER_CLAIM").expect("started by its test"));
        let port = std::env::var("SILVIC_FOLDER_PORT").unwrap();
        println!();
        println!("READY");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        match publish(&dir, 1, 2, &format!("127.0.0.1:{port}"), TOKEN) {
            Ok(()) => println!("OK"),
            Err(e) => println!("ERR {e}"),
        }
    }

    /// Finding 10: a file an earlier run (another token) left, or one forged without the
    /// token, is ignored, never dialled.
    #[test]
    fn a_file_of_another_job_or_without_a_valid_mac_is_ignored_not_dialled() {
        let dir = scratch_dir("stale");
        publish(&dir, 0, 2, "127.0.0.1:1", TOKEN).unwrap();
        publish(&dir, 1, 2, "127.0.0.1:666", b"an-earlier-runs-token").unwrap();
        let e = gather(&dir, 2, TOKEN, Duration::from_millis(100)).unwrap_err();
        assert_eq!(e.peer(), Some(1));
        assert!(e.to_string().contains("rank-1 was ignored: the address of another job"), "{e}");
        // Rank 1 of this run is told why it cannot claim its name.
        let e = publish(&dir, 1, 2, "127.0.0.1:2", TOKEN).unwrap_err();
        assert!(e.to_string().contains("it holds the address of another job"), "{e}");
        withdraw(&dir, 1);
        let forged = body(TOKEN, 1, 2, "127.0.0.1:666");
        fs::write(path(&dir, 1), format!("{forged}mac {}\n", "0".repeat(64))).unwrap();
        let e = gather(&dir, 2, TOKEN, Duration::from_millis(100)).unwrap_err();
        assert!(e.to_string().contains("whose MAC does not verify"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
