//! Zeros written ahead of the journal's frames (issue 56). A segment is sized up front but
//! sparse, so a group's frame lands in blocks the file system has not allocated yet and the
//! group's fdatasync writes the file's block map too: a second device write in every group.
//! A thread of the journal's own writes zeros a little ahead of the frames and fdatasyncs
//! them, so a frame overwrites blocks already written and its fdatasync writes only the
//! frame (PostgreSQL zero-fills a WAL segment for the same reason, all at once).
//!
//! Zeros read as a hole does, so a crash at any point leaves the segment as readable as
//! before. The thread never writes where a frame was or is being written: the committer
//! reserves its frame's bytes first, and waits only when the thread is writing there (the
//! thread fell behind).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// How far ahead of the frames the zeros go.
const AHEAD_BYTES: u64 = 4 * 1024 * 1024;
/// Zeros written and fdatasynced at a time.
const CHUNK_BYTES: u64 = 512 * 1024;
/// The file system's block, to which zeros are aligned.
const BLOCK_BYTES: u64 = 4096;

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
    /// The segment being appended to, and its size.
    segment: Option<(Arc<File>, u64)>,
    /// The end of the frames written or being written.
    frames_end: u64,
    /// Where zeros end (written and fdatasynced, or being written: `busy`).
    zeroed: u64,
    /// The bytes the thread is writing zeros to.
    busy: Option<(u64, u64)>,
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

    /// Frames now go to `file` (of `size` bytes) from `offset`.
    pub fn segment(&self, file: Arc<File>, size: u64, offset: u64) {
        let mut state = self.shared.wait_while_busy(|_| true);
        state.segment = Some((file, size));
        (state.frames_end, state.zeroed) = (offset, offset);
        self.shared.changed.notify_all();
    }

    /// A frame is about to be written to `start..end` of the current segment: waits while
    /// zeros are being written there.
    pub fn reserve(&self, start: u64, end: u64) {
        let mut state = self
            .shared
            .wait_while_busy(|(from, to)| from < end && start < to);
        state.frames_end = state.frames_end.max(end);
        self.shared.changed.notify_all();
    }
}

#[cfg(test)]
impl ZeroAhead {
    /// Waits until the zeros are as far ahead as they go.
    pub fn settle(&self) {
        let mut state = self.shared.lock();
        while state.busy.is_some() || next_chunk(&mut state).is_some() {
            state = self
                .shared
                .changed
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
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

    /// The state, once no zeros are being written to bytes `overlaps` says it cares about.
    fn wait_while_busy(&self, overlaps: impl Fn((u64, u64)) -> bool) -> MutexGuard<'_, State> {
        let mut state = self.lock();
        while state.busy.is_some_and(&overlaps) {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        state
    }

    fn run(&self) {
        let zeros = vec![0u8; CHUNK_BYTES as usize];
        let mut state = self.lock();
        loop {
            if state.stop {
                return;
            }
            let Some((file, start, end)) = next_chunk(&mut state) else {
                state = self
                    .changed
                    .wait(state)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                continue;
            };
            state.busy = Some((start, end));
            drop(state);
            let written = file
                .write_all_at(&zeros[..(end - start) as usize], start)
                .and_then(|()| file.sync_data());
            state = self.lock();
            if written.is_ok() {
                state.zeroed = state.zeroed.max(end);
            }
            state.busy = None;
            self.changed.notify_all();
            if let Err(error) = written {
                // The frames' own writes meet the same device and report it.
                tracing::warn!(%error, "the journal stops writing zeros ahead of its frames");
                return;
            }
        }
    }
}

/// The next bytes to zero, if the zeros are less than `AHEAD_BYTES` past the frames: from
/// the first whole block after both, up to a chunk, within the segment.
fn next_chunk(state: &mut State) -> Option<(Arc<File>, u64, u64)> {
    let (file, size) = state.segment.as_ref()?;
    let start = state
        .zeroed
        .max(state.frames_end)
        .next_multiple_of(BLOCK_BYTES);
    let end = (start + CHUNK_BYTES).min(*size);
    let wanted = start < state.frames_end + AHEAD_BYTES && start < end;
    wanted.then(|| (Arc::clone(file), start, end))
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
        let file = Arc::new(options.open(&path).expect("file"));
        let size = 64 << 20;
        file.set_len(size).expect("size");
        let zero = ZeroAhead::start().expect("thread");
        zero.segment(Arc::clone(&file), size, 8);
        // Caught writing zeros (eight chunks with an fdatasync each: milliseconds).
        let deadline = Instant::now() + Duration::from_secs(10);
        while zero.shared.lock().busy.is_none() {
            assert!(Instant::now() < deadline, "no zeros written");
            std::thread::yield_now();
        }
        let frame_end = 2 << 20;
        zero.reserve(8, frame_end);
        let state = zero.shared.lock();
        assert!(
            state.busy.is_none_or(|(from, _)| from >= frame_end),
            "zeros being written over the frame: {:?}",
            state.busy
        );
        assert_eq!(state.frames_end, frame_end);
    }
}
