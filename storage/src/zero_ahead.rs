//! Zeros written ahead of the journal's frames (issue 56). A segment is sized up front but
//! sparse, so a group's frame lands in blocks the file system has not allocated yet and the
//! group's fdatasync writes the file's block map too: a second device write in every group.
//! A thread of the journal's own writes zeros a little ahead of the frames and fdatasyncs
//! them, so a frame overwrites blocks already written and its fdatasync writes only the
//! frame (PostgreSQL zero-fills a WAL segment for the same reason, all at once).
//!
//! Zeros read as a hole does, so a crash at any point leaves the segment as readable as
//! before. The thread never writes where a frame was or is being written: the committer
//! reserves its frame's bytes first, and the zeros keep `LEAD_BYTES` past the frames, so a
//! frame waits for them only if it is larger than that and the thread is writing there.
//!
//! The thread opens each segment itself: a write-back error its fdatasync reports is then
//! reported again to the committer's own fdatasync (Linux reports an error once per open
//! file), never swallowed on the way to an acknowledgement.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// How far ahead of the frames the zeros go.
const AHEAD_BYTES: u64 = 4 * 1024 * 1024;
/// Zeros written and fdatasynced at a time.
const CHUNK_BYTES: u64 = 512 * 1024;
/// How near the frames zeros may start: the frames of a new segment (or after the thread
/// fell behind) do not wait for a chunk written where they are about to go.
pub(crate) const LEAD_BYTES: u64 = CHUNK_BYTES;
/// The file system's block, to which zeros are aligned.
const BLOCK_BYTES: u64 = 4096;
/// Zeros only while the disk has this much free: on a nearly full disk they would take the
/// space frames and sled need, and fill it first.
const FREE_BYTES_MIN: u64 = 64 * 1024 * 1024;

/// The zeroing thread of one journal; stopped when dropped.
#[derive(Debug)]
pub(crate) struct ZeroAhead {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// The segment being appended to (the thread's own open of it), and its size.
    segment: Option<(Arc<File>, u64)>,
    /// Counts the segments: a chunk of an older one says nothing of this one.
    generation: u64,
    /// The end of the frames written or being written.
    frames_end: u64,
    /// Where zeros end (written and fdatasynced, or being written: `busy`).
    zeroed: u64,
    /// The bytes of the segment of that generation the thread is writing zeros to.
    busy: Option<(u64, u64, u64)>,
    /// Stopped: dropped, or a write of its own failed.
    stop: bool,
}

impl ZeroAhead {
    /// Starts the thread, idle until `segment`. `None` when it cannot be started: the
    /// journal works without it, only slower.
    pub fn start() -> Option<Self> {
        let shared = Arc::new(Shared::default());
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("openprogram-zero".into())
            .spawn(move || worker.run());
        match thread {
            Ok(thread) => Some(ZeroAhead {
                shared,
                thread: Some(thread),
            }),
            Err(error) => {
                tracing::warn!(%error, "the journal writes without zeros ahead: no thread");
                None
            }
        }
    }

    /// Frames now go to the segment at `path` (of `size` bytes) from `offset`.
    pub fn segment(&self, path: &Path, size: u64, offset: u64) {
        let opened = std::fs::OpenOptions::new().write(true).open(path);
        let mut state = self.shared.lock();
        state.generation += 1;
        state.segment = match opened {
            Ok(file) => Some((Arc::new(file), size)),
            Err(error) => {
                let path = path.display();
                tracing::warn!(%error, %path, "no zeros ahead in this journal segment");
                None
            }
        };
        (state.frames_end, state.zeroed) = (offset, offset);
        self.shared.changed.notify_all();
    }

    /// A frame is about to be written to `start..end` of the current segment: waits while
    /// zeros are being written there.
    pub fn reserve(&self, start: u64, end: u64) {
        let mut state = self.shared.lock();
        loop {
            let generation = state.generation;
            let overlaps =
                |(of, from, to): (u64, u64, u64)| of == generation && from < end && start < to;
            if !state.busy.is_some_and(overlaps) {
                break;
            }
            state = self.shared.wait(state);
        }
        state.frames_end = state.frames_end.max(end);
        // The thread is woken only when the frames moved it to a chunk, not every group.
        if state.busy.is_none() && next_range(&state).is_some() {
            self.shared.changed.notify_all();
        }
    }
}

impl Drop for ZeroAhead {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed
            .wait(state)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn run(&self) {
        let zeros = vec![0u8; CHUNK_BYTES as usize];
        let mut state = self.lock();
        loop {
            if state.stop {
                return;
            }
            let Some((file, start, end)) = next_chunk(&state) else {
                state = self.wait(state);
                continue;
            };
            let generation = state.generation;
            if !has_room(&file) {
                // This segment's frames allocate their own blocks; the next one looks again.
                state.zeroed = state.segment.as_ref().map_or(end, |(_, size)| *size);
                continue;
            }
            state.busy = Some((generation, start, end));
            drop(state);
            let written = file
                .write_all_at(&zeros[..(end - start) as usize], start)
                .and_then(|()| file.sync_data());
            state = self.lock();
            if written.is_ok() && state.generation == generation {
                state.zeroed = state.zeroed.max(end);
            }
            state.busy = None;
            if let Err(error) = written {
                // The committer's own writes and fdatasyncs meet the same device and report
                // it themselves (its own open of the file sees the error too).
                tracing::warn!(%error, "the journal stops writing zeros ahead of its frames");
                state.stop = true;
            }
            self.changed.notify_all();
        }
    }
}

/// Whether the file's disk has room for zeros (`FREE_BYTES_MIN`); unknown counts as room.
fn has_room(file: &File) -> bool {
    rustix::fs::fstatvfs(file).map_or(true, |disk| {
        disk.f_bavail.saturating_mul(disk.f_frsize) >= FREE_BYTES_MIN
    })
}

/// The next bytes to zero, if the zeros are less than `AHEAD_BYTES` past the frames: from
/// the first whole block at least `LEAD_BYTES` past the frames and after the zeros, up to a
/// chunk, within the segment.
fn next_chunk(state: &State) -> Option<(Arc<File>, u64, u64)> {
    let (start, end) = next_range(state)?;
    let (file, _) = state.segment.as_ref()?;
    Some((Arc::clone(file), start, end))
}

/// `next_chunk`'s bytes.
fn next_range(state: &State) -> Option<(u64, u64)> {
    let (_, size) = state.segment.as_ref()?;
    let start = state
        .zeroed
        .max(state.frames_end + LEAD_BYTES)
        .next_multiple_of(BLOCK_BYTES);
    let end = (start + CHUNK_BYTES).min(*size);
    let wanted = start < state.frames_end + AHEAD_BYTES && start < end;
    wanted.then_some((start, end))
}

#[cfg(test)]
impl ZeroAhead {
    /// Waits until the zeros are as far ahead as they go (or the thread stopped).
    pub fn settle(&self) {
        let mut state = self.shared.lock();
        while !state.stop && (state.busy.is_some() || next_chunk(&state).is_some()) {
            state = self.shared.wait(state);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn s3_a_frame_waits_while_zeros_are_written_where_it_goes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("segment");
        let options = File::options().read(true).write(true).create(true).clone();
        let file = options.open(&path).expect("file");
        let size = 64 << 20;
        file.set_len(size).expect("size");
        let zero = ZeroAhead::start().expect("thread");
        zero.segment(&path, size, 8);
        // Caught writing zeros (seven chunks with an fdatasync each: milliseconds).
        let deadline = Instant::now() + Duration::from_secs(10);
        let busy = loop {
            if let Some((_, from, _)) = zero.shared.lock().busy {
                break from;
            }
            assert!(Instant::now() < deadline, "no zeros written");
            std::thread::yield_now();
        };
        // Zeros keep their lead on the frames: never nearer than it.
        assert!(busy >= 8 + LEAD_BYTES, "{busy}");
        let frame_end = 2 << 20;
        zero.reserve(8, frame_end);
        let state = zero.shared.lock();
        assert!(
            state.busy.is_none_or(|(_, from, _)| from >= frame_end),
            "zeros being written over the frame: {:?}",
            state.busy
        );
        assert_eq!(state.frames_end, frame_end);
    }

    #[test]
    fn s3_a_chunk_of_an_older_segment_holds_no_frame_of_the_next() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (old, new) = (dir.path().join("old"), dir.path().join("new"));
        let size = 64 << 20;
        for path in [&old, &new] {
            let file = File::create(path).expect("file");
            file.set_len(size).expect("size");
        }
        let zero = ZeroAhead::start().expect("thread");
        zero.segment(&old, size, 8);
        let deadline = Instant::now() + Duration::from_secs(10);
        while zero.shared.lock().busy.is_none() {
            assert!(Instant::now() < deadline, "no zeros written");
            std::thread::yield_now();
        }
        // A roll while the old segment's chunk is in flight: the new segment's first frame,
        // where that chunk's bytes would be in the old file, goes on at once.
        zero.segment(&new, size, 8);
        zero.reserve(8, 4 << 20);
        let state = zero.shared.lock();
        assert_eq!(state.frames_end, 4 << 20);
        assert!(state.zeroed <= 8 || state.zeroed >= state.frames_end + LEAD_BYTES);
    }
}
