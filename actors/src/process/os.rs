//! The OS side of a managed process (SPEC P-1, P-3): spawning a command in its own process
//! group, keeping a bounded tail of its output, and signalling it only when it is provably
//! still the process we started.
//!
//! Nothing here records anything: the caller decides what to persist (the identity, the
//! tail, the exit code) and when.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};

use rustix::io::Errno;
use rustix::process::{kill_process_group, pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, ChildStderr, ChildStdout, Command};

/// The most one read hands to `read_output`'s callback.
const CHUNK: usize = 64 * 1024;

/// Bounded tail of a process's output plus the total count of bytes ever pushed.
///
/// A process may print gigabytes; memory stays at `capacity` while `total` still tells
/// how much was produced (P-1).
#[derive(Debug, Clone)]
pub struct OutputRing {
    capacity: usize,
    /// Fills up to `capacity` once, then is overwritten in place.
    buf: Vec<u8>,
    /// When `buf` is full: the index of the oldest byte, which is also the next to overwrite.
    start: usize,
    total: u64,
}

impl OutputRing {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            buf: Vec::with_capacity(capacity),
            start: 0,
            total: 0,
        }
    }

    /// Appends `bytes`, dropping the oldest ones past `capacity`. O(len).
    pub fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.capacity == 0 {
            return;
        }
        // Only the last `capacity` bytes of this push can survive it.
        let bytes = &bytes[bytes.len().saturating_sub(self.capacity)..];
        let room = self.capacity - self.buf.len();
        let (fill, rest) = bytes.split_at(room.min(bytes.len()));
        self.buf.extend_from_slice(fill);
        if rest.is_empty() {
            return;
        }
        // The buffer is full: overwrite from `start`, wrapping once at most.
        let first = rest.len().min(self.capacity - self.start);
        self.buf[self.start..self.start + first].copy_from_slice(&rest[..first]);
        self.buf[..rest.len() - first].copy_from_slice(&rest[first..]);
        self.start = (self.start + rest.len()) % self.capacity;
    }

    /// All bytes ever pushed, kept or not.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The last min(total, capacity) bytes, oldest first.
    pub fn tail(&self) -> Vec<u8> {
        let mut tail = Vec::with_capacity(self.buf.len());
        tail.extend_from_slice(&self.buf[self.start..]);
        tail.extend_from_slice(&self.buf[..self.start]);
        tail
    }
}

/// Who a pid is: the pid plus its start time (field 22 of /proc/<pid>/stat, clock ticks
/// since boot). A pid is reused once its process is reaped; the pair is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OsIdentity {
    pub pid: u32,
    pub start_time: u64,
}

/// What we need from one /proc/<pid>/stat line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// Field 3: R, S, D, Z, ...
    state: char,
    /// Field 22.
    start_time: u64,
}

/// Parses a /proc/<pid>/stat line. The comm field (2) is free text that may hold spaces
/// and ')', so the fixed fields are counted from after the LAST ')'.
fn parse_stat(text: &str) -> Option<Stat> {
    let after_comm = &text[text.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace();
    // Fields after comm start at number 3; start_time is number 22.
    let state = fields.next()?.chars().next()?;
    let start_time = fields.nth(22 - 4)?.parse().ok()?;
    Some(Stat { state, start_time })
}

fn read_stat(pid: u32) -> io::Result<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat is not in the expected format"),
        )
    })
}

/// Reads /proc/<pid>/stat. A pid with no entry is `io::ErrorKind::NotFound`.
pub fn identity_of(pid: u32) -> io::Result<OsIdentity> {
    let stat = read_stat(pid)?;
    Ok(OsIdentity {
        pid,
        start_time: stat.start_time,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM: asks the process to end; it may catch or ignore it.
    Terminate,
    /// SIGKILL: cannot be caught or ignored.
    Kill,
}

impl StopSignal {
    fn rustix(self) -> Signal {
        match self {
            StopSignal::Terminate => Signal::TERM,
            StopSignal::Kill => Signal::KILL,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// The process is gone (ESRCH, or no /proc entry).
    #[error("the process is gone")]
    Gone,
    /// The pid now belongs to another process (pid reuse): never signalled.
    #[error("pid {pid} now belongs to another process (start time {found}, expected {expected}); not signalled")]
    NotOurs { pid: u32, expected: u64, found: u64 },
    #[error("signalling failed: {0}")]
    Io(#[from] io::Error),
}

/// True for the errors that mean "no such process": ESRCH, or a missing /proc entry.
fn is_gone(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::NotFound || err.raw_os_error() == Some(Errno::SRCH.raw_os_error())
}

fn from_os_error(err: io::Error) -> SignalError {
    if is_gone(&err) {
        SignalError::Gone
    } else {
        SignalError::Io(err)
    }
}

/// `pid` as the OS names it: 0 would mean our own process (group) and a value past i32::MAX
/// a negative one, never a child's.
fn pid_of(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().and_then(Pid::from_raw)
}

/// Sends `signal` to the process group whose id is `pid`.
fn killpg(pid: u32, signal: StopSignal) -> Result<(), SignalError> {
    let Some(pgrp) = pid_of(pid) else {
        return Err(SignalError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{pid} is not a process group id"),
        )));
    };
    kill_process_group(pgrp, signal.rustix()).map_err(|errno| from_os_error(errno.into()))
}

/// Sends `signal` to the process group led by `identity.pid` ONLY if /proc/<pid>/stat still
/// shows `identity.start_time`; otherwise NotOurs and nothing is sent (P-3: a saved pid
/// alone is never permission to signal).
///
/// The check and the signal are two steps; only a pidfd (see `Signaller`) closes the gap
/// between them. This is for an identity saved by an earlier run, where there is no pidfd.
pub fn signal_verified(identity: OsIdentity, signal: StopSignal) -> Result<(), SignalError> {
    let now = identity_of(identity.pid).map_err(from_os_error)?;
    if now.start_time != identity.start_time {
        return Err(SignalError::NotOurs {
            pid: identity.pid,
            expected: identity.start_time,
            found: now.start_time,
        });
    }
    killpg(identity.pid, signal)
}

/// What signals a spawned child: a pidfd when the kernel has it, else the verified identity.
///
/// A pidfd refers to one process, not to a number, so it cannot be fooled by pid reuse.
#[derive(Debug)]
pub struct Signaller {
    identity: OsIdentity,
    pidfd: Option<OwnedFd>,
}

impl Signaller {
    /// Opens a pidfd for `identity.pid`. Any failure (ENOSYS on an old kernel, a seccomp
    /// filter) leaves it out: the verified identity is the fallback, not an error.
    fn open(identity: OsIdentity) -> Self {
        let pidfd = pid_of(identity.pid).and_then(|pid| pidfd_open(pid, PidfdFlags::empty()).ok());
        Self { identity, pidfd }
    }

    pub fn identity(&self) -> OsIdentity {
        self.identity
    }

    /// Signals the child's process group. With a pidfd: the leader first, through the
    /// pidfd, which names this very process and fails with ESRCH once it is reaped
    /// (→ Gone); then killpg(pid, sig) for its children: the leader was unreaped a moment
    /// before, so its pid (the group id) was still its own. A `wait` running concurrently
    /// could reap it between the two calls; the pid would then have to be reused within
    /// that instant for the group signal to go astray. Without a pidfd: `signal_verified`.
    pub fn send(&self, signal: StopSignal) -> Result<(), SignalError> {
        let Some(pidfd) = &self.pidfd else {
            return signal_verified(self.identity, signal);
        };
        pidfd_send_signal(pidfd, signal.rustix()).map_err(|errno| from_os_error(errno.into()))?;
        killpg(self.identity.pid, signal)
    }
}

#[derive(Debug)]
pub struct Spawned {
    pub signaller: Signaller,
    /// stdout and stderr are still inside (piped); the caller takes them.
    pub child: Child,
}

/// Starts `program args` with stdin null, stdout and stderr piped, in its own process group
/// (so a stop reaches its children too), `kill_on_drop(false)` (the caller, not a drop,
/// decides when it ends). Records its identity right after spawn (the child is unreaped,
/// so its pid cannot have been reused) and opens a pidfd. A program that does not exist
/// is an Err (io::ErrorKind::NotFound).
///
/// Must run inside a Tokio runtime (the pipes and the reaper register with it); outside
/// one it is an error, before anything is started.
pub fn spawn(program: &str, args: &[String]) -> io::Result<Spawned> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(io::Error::other("spawn needs a Tokio runtime"));
    }
    let mut child = Command::new(program)
        .args(args)
        // A failpoint armed for this runtime is not the managed process's (R01).
        .env_remove("OP_FAILPOINT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false)
        .spawn()?;
    let identity = child
        .id()
        .ok_or_else(|| io::Error::other("the child has no pid right after spawn"))
        .and_then(identity_of)
        .inspect_err(|_| {
            // Unrecorded, it could never be stopped later: end it now. It is unreaped,
            // so its pid is still its own.
            let _ = child.start_kill();
        })?;
    Ok(Spawned {
        signaller: Signaller::open(identity),
        child,
    })
}

/// Reads once from `reader`; a closed (None) one never completes, so its select! branch
/// simply stays idle.
async fn read_chunk<R: AsyncRead + Unpin>(
    reader: &mut Option<R>,
    buf: &mut [u8],
) -> io::Result<usize> {
    match reader {
        Some(reader) => reader.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Reads stdout and stderr concurrently until both reach EOF, handing each chunk read (at
/// most 64 KiB) to `on_chunk` in arrival order. Concurrently, because a child blocked on a
/// full stderr pipe would never finish its stdout.
pub async fn read_output(
    mut stdout: Option<ChildStdout>,
    mut stderr: Option<ChildStderr>,
    mut on_chunk: impl FnMut(&[u8]),
) -> io::Result<()> {
    let mut out_buf = vec![0u8; CHUNK];
    let mut err_buf = vec![0u8; CHUNK];
    while stdout.is_some() || stderr.is_some() {
        // Both reads are cancel-safe: a read that loses the race has consumed nothing.
        tokio::select! {
            read = read_chunk(&mut stdout, &mut out_buf), if stdout.is_some() => match read? {
                0 => stdout = None,
                n => on_chunk(&out_buf[..n]),
            },
            read = read_chunk(&mut stderr, &mut err_buf), if stderr.is_some() => match read? {
                0 => stderr = None,
                n => on_chunk(&err_buf[..n]),
            },
        }
    }
    Ok(())
}

/// The exit code of a status: its code, or 128 + the signal number when killed by a
/// signal (the shell's convention, so one integer says both).
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        // A wait status is an exit or a signal; anything else is not a normal end.
        (None, None) => -1,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const BOUND: Duration = Duration::from_secs(10);

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    /// Ends the test's process group if a failed assertion leaves it running. Verified, so
    /// it never hits a process that reused the pid after the test reaped its own.
    struct Cleanup(OsIdentity);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = signal_verified(self.0, StopSignal::Kill);
        }
    }

    fn start(program: &str, args: &[&str]) -> (Spawned, Cleanup) {
        let spawned = spawn(program, &strings(args)).expect("spawn");
        let cleanup = Cleanup(spawned.signaller.identity());
        (spawned, cleanup)
    }

    /// Reads `stdout` until `needle` has appeared, within BOUND.
    async fn read_until(stdout: &mut ChildStdout, needle: &str) -> String {
        let mut seen = String::new();
        let mut buf = [0u8; 1024];
        tokio::time::timeout(BOUND, async {
            while !seen.contains(needle) {
                let n = stdout.read(&mut buf).await.expect("read stdout");
                assert!(n > 0, "stdout ended before {needle:?}: {seen:?}");
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{needle:?} not seen in time: {seen:?}"));
        seen
    }

    async fn wait_code(child: &mut Child) -> i32 {
        let status = tokio::time::timeout(BOUND, child.wait())
            .await
            .expect("the process did not end in time")
            .expect("wait");
        exit_code(status)
    }

    #[test]
    fn p1_ring_keeps_a_bounded_tail_and_counts_every_byte() {
        const TOTAL: usize = 20_000_000;
        const CAPACITY: usize = 64 * 1024;
        let pattern = |i: usize| (i % 251) as u8;
        let mut ring = OutputRing::new(CAPACITY);
        assert!(ring.tail().is_empty());
        let sizes = [1, 7, 4093, CAPACITY, 100_000, 3, CAPACITY - 1, 65_537];
        let mut pushed = 0;
        for size in sizes.iter().cycle() {
            if pushed == TOTAL {
                break;
            }
            let end = (pushed + size).min(TOTAL);
            let chunk: Vec<u8> = (pushed..end).map(pattern).collect();
            ring.push(&chunk);
            pushed = end;
            assert!(ring.buf.len() <= CAPACITY && ring.buf.capacity() <= CAPACITY);
        }
        assert_eq!(ring.total(), TOTAL as u64);
        let expected: Vec<u8> = (TOTAL - CAPACITY..TOTAL).map(pattern).collect();
        assert_eq!(ring.tail(), expected);

        // Short of capacity, the tail is everything; a zero ring only counts.
        let mut small = OutputRing::new(8);
        small.push(b"abc");
        assert_eq!(small.tail(), b"abc");
        small.push(b"defghij");
        assert_eq!(small.tail(), b"cdefghij");
        let mut zero = OutputRing::new(0);
        zero.push(b"abc");
        assert_eq!((zero.total(), zero.tail()), (3, Vec::new()));
    }

    #[tokio::test]
    async fn p1_twenty_megabytes_of_output_are_counted() {
        let (mut spawned, _cleanup) = start("head", &["-c", "20000000", "/dev/zero"]);
        let mut ring = OutputRing::new(64 * 1024);
        let (stdout, stderr) = (spawned.child.stdout.take(), spawned.child.stderr.take());
        tokio::time::timeout(BOUND, read_output(stdout, stderr, |chunk| ring.push(chunk)))
            .await
            .expect("output did not end in time")
            .expect("read_output");
        assert_eq!(ring.total(), 20_000_000);
        let tail = ring.tail();
        assert_eq!(tail.len(), 65_536);
        assert!(tail.iter().all(|b| *b == 0));
        assert_eq!(wait_code(&mut spawned.child).await, 0);
    }

    #[test]
    fn p3_identity_parses_a_comm_with_spaces_and_parens() {
        let line = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 \
                    987654 1000 200 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0\n";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'S',
                start_time: 987_654
            })
        );
        assert_eq!(parse_stat("1234 (no close paren S 1 2 3"), None);
        assert_eq!(parse_stat("1234 (short) S 1 2 3"), None);
        let me = identity_of(std::process::id()).expect("our own stat");
        assert_eq!(me.pid, std::process::id());
        assert!(me.start_time > 0);
    }

    #[tokio::test]
    async fn r20_a_forged_start_time_is_never_signalled() {
        let (mut spawned, _cleanup) = start("sleep", &["30"]);
        let real = spawned.signaller.identity();
        let forged = OsIdentity {
            start_time: real.start_time + 1,
            ..real
        };
        match signal_verified(forged, StopSignal::Terminate) {
            Err(SignalError::NotOurs {
                pid,
                expected,
                found,
            }) => assert_eq!(
                (pid, expected, found),
                (real.pid, forged.start_time, real.start_time)
            ),
            other => panic!("expected NotOurs, got {other:?}"),
        }
        assert_ne!(read_stat(real.pid).expect("stat").state, 'Z');
        assert!(matches!(spawned.child.try_wait(), Ok(None)));
        // Had the SIGTERM been sent, it would already be the fatal signal recorded for
        // the process, and the exit code would be 143, not 137.
        spawned.signaller.send(StopSignal::Kill).expect("kill");
        assert_eq!(wait_code(&mut spawned.child).await, 128 + 9);
    }

    #[tokio::test]
    async fn p1_terminate_ends_a_process_and_kill_ends_one_that_ignores_it() {
        let script = "trap 'echo got-term' TERM; echo ready; while :; do sleep 0.05; done";
        let (mut spawned, _cleanup) = start("sh", &["-c", script]);
        let mut stdout = spawned.child.stdout.take().expect("stdout");
        read_until(&mut stdout, "ready").await;
        spawned
            .signaller
            .send(StopSignal::Terminate)
            .expect("terminate");
        read_until(&mut stdout, "got-term").await;
        assert!(matches!(spawned.child.try_wait(), Ok(None)));
        spawned.signaller.send(StopSignal::Kill).expect("kill");
        assert_eq!(wait_code(&mut spawned.child).await, 128 + 9);

        let (mut plain, _cleanup) = start("sleep", &["30"]);
        plain
            .signaller
            .send(StopSignal::Terminate)
            .expect("terminate");
        assert_eq!(wait_code(&mut plain.child).await, 128 + 15);
    }

    #[tokio::test]
    async fn p1_a_missing_program_is_an_error() {
        let err = spawn("/nonexistent/prog", &[]).expect_err("no such program");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn p1_spawn_outside_a_runtime_is_an_error() {
        assert!(spawn("true", &[]).is_err());
    }

    #[tokio::test]
    async fn p1_a_stop_reaches_the_process_group() {
        let (mut spawned, _cleanup) = start("sh", &["-c", "sleep 30 & echo started; wait"]);
        let mut stdout = spawned.child.stdout.take().expect("stdout");
        read_until(&mut stdout, "started").await;
        spawned.signaller.send(StopSignal::Kill).expect("kill");
        // The grandchild `sleep` holds the pipes too: EOF means it was killed as well.
        let stderr = spawned.child.stderr.take();
        tokio::time::timeout(BOUND, read_output(Some(stdout), stderr, |_| {}))
            .await
            .expect("the group's pipes did not close in time")
            .expect("read_output");
        assert_eq!(wait_code(&mut spawned.child).await, 128 + 9);
    }

    #[tokio::test]
    async fn p3_without_a_pidfd_the_verified_identity_signals() {
        let (mut spawned, _cleanup) = start("sleep", &["30"]);
        let fallback = Signaller {
            identity: spawned.signaller.identity(),
            pidfd: None,
        };
        fallback.send(StopSignal::Kill).expect("kill");
        assert_eq!(wait_code(&mut spawned.child).await, 128 + 9);
        assert!(matches!(
            fallback.send(StopSignal::Kill),
            Err(SignalError::Gone | SignalError::NotOurs { .. })
        ));
    }

    #[tokio::test]
    async fn p3_signal_to_a_gone_process_is_gone() {
        let (mut spawned, _cleanup) = start("true", &[]);
        assert_eq!(wait_code(&mut spawned.child).await, 0);
        assert!(matches!(
            spawned.signaller.send(StopSignal::Terminate),
            Err(SignalError::Gone)
        ));
        // The fallback path agrees (unless the pid was reused meanwhile: then NotOurs).
        assert!(matches!(
            signal_verified(spawned.signaller.identity(), StopSignal::Terminate),
            Err(SignalError::Gone | SignalError::NotOurs { .. })
        ));
    }
}
