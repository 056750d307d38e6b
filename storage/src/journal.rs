//! One device wait per group commit (S-3, issue 56), and the home of the log's history (S-9):
//! the committer appends each group's writes to this journal and fdatasyncs it once, then
//! applies them to sled in memory and answers; sled is flushed and fsynced in the background
//! (`log/flusher.rs`), which records in sled the newest frame it holds (`keys::
//! META_JOURNAL_SEQ`). An open replays the frames after it (`open.rs`). A log record stays
//! where its frame put it and sled keeps its location (`history.rs`): a segment goes once
//! sled holds all its frames and no record lives in it.
//!
//! Files: `DIR/journal/{first seq:020}.wal`, each sized up front, sparse; zeros are written a
//! little ahead of the frames (`zero_ahead.rs`), and read as its holes do. A segment is
//! `b"OPJL"`, the format byte, 3 zero bytes, then frames: the payload's length (u32,
//! little-endian; 0 ends the segment), the CRC-32 of the payload (u32, little-endian), the
//! payload: the group's seq (u64), its last log position (u64), the number of writes (u32),
//! each write a tag (1 insert, 0 remove), the key's length (u32) and key, and for an insert
//! the value's length (u32) and value — all little-endian. Format 2 is format 1 whose
//! segments may hold history (a build that reads only format 1 refuses them instead of
//! dropping them). A frame that ends the newest segment short or fails its CRC is a write a
//! crash cut: it was never fsynced, so never acknowledged, and the journal ends before it.
//! The same in any earlier place refuses the open (`Error::Corrupted`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use sled::IVec;

use crate::error::{Error, Result};
use crate::history::{Liveness, Location, Segments};
use crate::zero_ahead::ZeroAhead;

const MAGIC: &[u8; 4] = b"OPJL";
const FORMAT: u8 = 2;
/// Segments of format 1 (schema 14) are read alike: they hold only frames to replay.
const FORMAT_1: u8 = 1;
const HEADER_BYTES: u64 = 8;
/// A frame's length and CRC, before its payload.
const FRAME_HEADER_BYTES: u64 = 8;
/// A segment's size by default (`Limits::journal_segment_bytes`), set when it is created, so
/// a frame's fdatasync changes no file size.
pub(crate) const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// One frame read back: a group's writes, and where each value lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JournalFrame {
    pub seq: u64,
    pub last_position: u64,
    pub ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// One per write: where its value lies (`None` for a removal).
    pub locations: Vec<Option<Location>>,
}

/// A frame written: its seq, its size in bytes, and where each write's value lies.
#[derive(Debug)]
pub(crate) struct Written {
    pub seq: u64,
    pub bytes: u64,
    pub locations: Vec<Option<Location>>,
}

/// The segment being appended to, and the older ones still needed.
#[derive(Debug)]
pub(crate) struct Journal {
    dir: PathBuf,
    file: Arc<File>,
    /// Where the next frame goes in `file`.
    offset: u64,
    /// Every segment, oldest first: its first seq and path (the last is `file`'s).
    segments: Vec<(u64, PathBuf)>,
    /// The same segments, open for readers of history.
    readable: Arc<Segments>,
    /// The seq of the next frame.
    next_seq: u64,
    /// A segment's size.
    segment_bytes: u64,
    /// The encoding buffer, and where each value starts in it, kept between frames.
    buffer: Vec<u8>,
    values_at: Vec<Option<(u64, u32)>>,
    /// Writes zeros ahead of the frames, so that their fdatasync allocates no blocks.
    zero: Option<ZeroAhead>,
}

impl Journal {
    /// Opens the journal in `dir` (created if missing): the frames after `held` (the newest
    /// one sled holds; `None`: a store from before schema 15, whose every frame kept is
    /// replayed), oldest first, and the journal to append to. A segment whose frames all
    /// come before is not read, only checked to be a segment: sled holds them, and its
    /// records are read where sled locates them. Refused: frames sled holds or needs that are
    /// missing, and damage (see `read_segment`).
    pub fn open(
        dir: &Path,
        held: Option<u64>,
        segment_bytes: u64,
    ) -> Result<(Self, Vec<JournalFrame>)> {
        let mut names = list(dir)?;
        let first_kept = names.first().map_or(1, |(first, _)| *first);
        let replay_after = held.unwrap_or(first_kept.saturating_sub(1));
        let readable = Segments::new(dir.to_path_buf());
        let mut frames = Vec::new();
        // The seq the next frame to replay must have, and the next after every frame read.
        let (mut expected, mut next_seq) = (replay_after + 1, 1);
        // Where the newest segment's next frame goes; `None`: a new segment is made.
        let mut end = None;
        for (index, (first, path)) in names.iter().enumerate() {
            let newest = index + 1 == names.len();
            let held = names
                .get(index + 1)
                .is_some_and(|(next, _)| *next <= replay_after.saturating_add(1));
            // A segment's name is the seq of its first frame, written or to come.
            next_seq = next_seq.max(*first);
            if held {
                read_header(path)?;
                readable.add(*first, Arc::new(open_rw(path)?));
                continue;
            }
            let Some(read) = read_segment(path, (*first, replay_after), newest)? else {
                // Created and not yet written whole (a crash then): made again below.
                std::fs::remove_file(path).map_err(|error| Error::io(path, error))?;
                continue;
            };
            // The frames to replay follow one another from the newest frame sled holds on.
            for frame in read
                .frames
                .into_iter()
                .filter(|frame| frame.seq > replay_after)
            {
                if frame.seq != expected {
                    return Err(damaged(path, "its frames do not follow the journal's"));
                }
                expected = frame.seq + 1;
                frames.push(frame);
            }
            readable.add(*first, Arc::new(open_rw(path)?));
            next_seq = next_seq.max(read.next_seq);
            end = newest.then_some(read.end);
        }
        names.retain(|(_, path)| path.exists());
        if next_seq != expected {
            let missing = format!("frames {expected} to {next_seq} are missing");
            return Err(damaged(dir, &missing));
        }
        let zero = ZeroAhead::start();
        let journal = match (names.last(), end) {
            (Some((_, path)), Some(offset)) => Journal {
                file: Arc::new(open_rw(path)?),
                dir: dir.to_path_buf(),
                offset,
                zero: zero.inspect(|zero| zero.segment(path, segment_bytes, offset)),
                segments: names,
                readable,
                next_seq,
                segment_bytes,
                buffer: Vec::new(),
                values_at: Vec::new(),
            },
            _ => Journal::create(dir, (next_seq, segment_bytes), names, readable, zero)?,
        };
        Ok((journal, frames))
    }

    /// A journal whose newest segment is a new one starting at `next_seq`.
    fn create(
        dir: &Path,
        (next_seq, segment_bytes): (u64, u64),
        mut segments: Vec<(u64, PathBuf)>,
        readable: Arc<Segments>,
        zero: Option<ZeroAhead>,
    ) -> Result<Self> {
        let path = dir.join(format!("{next_seq:020}.wal"));
        let file = open_rw(&path)?;
        // Whatever a file of that name held (a segment left with no whole frame) goes.
        file.set_len(0).map_err(|error| Error::io(&path, error))?;
        let mut header = [0u8; HEADER_BYTES as usize];
        header[..4].copy_from_slice(MAGIC);
        header[4] = FORMAT;
        let io = |error| Error::io(&path, error);
        file.write_all_at(&header, 0).map_err(io)?;
        match file.set_len(segment_bytes) {
            Ok(()) => {}
            // A file size limit below a segment: the file grows as frames are written, and
            // a write past the limit fails (fail-stop) as on a full disk.
            Err(error) if error.kind() == std::io::ErrorKind::FileTooLarge => {
                tracing::warn!(path = %path.display(), "the journal segment is not sized up front: the file size limit is lower")
            }
            Err(error) => return Err(io(error)),
        }
        file.sync_all().map_err(io)?;
        sync_dir(dir)?;
        let file = Arc::new(file);
        readable.add(next_seq, Arc::clone(&file));
        if let Some(zero) = &zero {
            zero.segment(&path, segment_bytes, HEADER_BYTES);
        }
        segments.push((next_seq, path));
        Ok(Journal {
            dir: dir.to_path_buf(),
            file,
            offset: HEADER_BYTES,
            segments,
            readable,
            next_seq,
            segment_bytes,
            buffer: Vec::new(),
            values_at: Vec::new(),
            zero,
        })
    }

    /// No zeros ahead of the frames from now on (`Limits::journal_zero_ahead`).
    pub fn stop_zeros(&mut self) {
        self.zero = None;
    }

    /// A segment's size.
    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// The segments, for readers of history.
    pub fn readable(&self) -> Arc<Segments> {
        Arc::clone(&self.readable)
    }

    /// The seq the next appended frame gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The segments other than the one being appended to, oldest first: each one's first
    /// seq, and whether sled holds all its frames (given the newest frame it holds).
    pub fn sealed(&self, durable_seq: u64) -> impl Iterator<Item = (u64, bool)> + '_ {
        self.segments
            .windows(2)
            .map(move |pair| (pair[0].0, pair[1].0 <= durable_seq.saturating_add(1)))
    }

    /// Refuses a journal that lacks a segment sled locates a record in: history lost.
    pub fn check_present(&self, liveness: &Liveness) -> Result<()> {
        let present = |segment| self.segments.iter().any(|(first, _)| *first == segment);
        match liveness.segments().find(|segment| !present(*segment)) {
            None => Ok(()),
            Some(missing) => Err(Error::Corrupted {
                tree: "journal",
                key: format!(
                    "{}: segment {missing:020}.wal, where history lives, is missing",
                    self.dir.display()
                ),
            }),
        }
    }

    /// Appends a group's writes as the next frame and makes it durable (`write`, then `sync`).
    #[cfg(test)]
    pub fn append(&mut self, last_position: u64, ops: &[(IVec, Option<IVec>)]) -> Result<u64> {
        let written = self.write(last_position, ops)?;
        self.sync()?;
        Ok(written.seq)
    }

    /// Writes a group's writes as the next frame (a new segment when this one is full), not
    /// yet durable.
    pub fn write(&mut self, last_position: u64, ops: &[(IVec, Option<IVec>)]) -> Result<Written> {
        let seq = self.next_seq;
        encode(
            &mut self.buffer,
            &mut self.values_at,
            seq,
            last_position,
            ops,
        );
        let frame_bytes = self.buffer.len() as u64;
        if self.offset + frame_bytes > self.segment_bytes && self.offset > HEADER_BYTES {
            let segments = std::mem::take(&mut self.segments);
            let (buffer, values_at) = (
                std::mem::take(&mut self.buffer),
                std::mem::take(&mut self.values_at),
            );
            let (sizes, readable) = ((seq, self.segment_bytes), Arc::clone(&self.readable));
            let zero = self.zero.take();
            *self = Journal::create(&self.dir, sizes, segments, readable, zero)?;
            (self.buffer, self.values_at) = (buffer, values_at);
        }
        if let Some(zero) = &self.zero {
            zero.reserve(self.offset, self.offset + frame_bytes);
        }
        // A group larger than a segment grows the file (its size is synced with it).
        let (segment, path) = &self.segments[self.segments.len() - 1];
        let io = |error| Error::io(path, error);
        self.file
            .write_all_at(&self.buffer, self.offset)
            .map_err(io)?;
        let at = |(start, len)| Location {
            segment: *segment,
            offset: self.offset + start,
            len,
        };
        let locations = self.values_at.iter().map(|value| value.map(at)).collect();
        self.offset += frame_bytes;
        self.next_seq += 1;
        Ok(Written {
            seq,
            bytes: frame_bytes,
            locations,
        })
    }

    /// Makes every frame written so far durable: one fdatasync (the segment's size is
    /// set up front, so it writes no file size).
    pub fn sync(&mut self) -> Result<()> {
        if crate::planted::planted(crate::planted::Bug::AckBeforeFsync) {
            return Ok(());
        }
        let path = &self.segments[self.segments.len() - 1].1;
        self.file
            .sync_data()
            .map_err(|error| Error::io(path, error))
    }

    /// Removes each segment, never the newest, whose frames sled all holds (through
    /// `durable_seq`) and in which no record lives (`live`, by the segment's first seq).
    pub fn drop_dead(&mut self, durable_seq: u64, live: impl Fn(u64) -> bool) -> Result<()> {
        let dead: Vec<u64> = self
            .sealed(durable_seq)
            .filter(|(first, held)| *held && !live(*first))
            .map(|(first, _)| first)
            .collect();
        if dead.is_empty() {
            return Ok(());
        }
        for first in dead {
            let index = self.segments.iter().position(|(seq, _)| *seq == first);
            let Some(index) = index else { continue };
            let (_, path) = self.segments.remove(index);
            self.readable.remove(first);
            std::fs::remove_file(&path).map_err(|error| Error::io(&path, error))?;
        }
        sync_dir(&self.dir)
    }
}

/// The segments in `dir` (created if missing), oldest first: each one's first seq and path.
fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    std::fs::create_dir_all(dir).map_err(|error| Error::io(dir, error))?;
    let mut names: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .map_err(|error| Error::io(dir, error))?
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let first = name.to_str()?.strip_suffix(".wal")?.parse().ok()?;
            Some((first, entry.path()))
        })
        .collect();
    names.sort();
    Ok(names)
}

/// The journal at `path` is damaged: `reason`.
fn damaged(path: &Path, reason: &str) -> Error {
    Error::Corrupted {
        tree: "journal",
        key: format!("{}: {reason}", path.display()),
    }
}

fn open_rw(path: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|error| Error::io(path, error))
}

/// Makes the directory's entries (segments created or removed) durable.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|error| Error::io(dir, error))
}

/// Encodes a frame into `buffer` (cleared first), and where each value starts in it and its
/// length into `values_at` (`None` for a removal).
fn encode(
    buffer: &mut Vec<u8>,
    values_at: &mut Vec<Option<(u64, u32)>>,
    seq: u64,
    last_position: u64,
    ops: &[(IVec, Option<IVec>)],
) {
    buffer.clear();
    values_at.clear();
    buffer.extend_from_slice(&[0u8; FRAME_HEADER_BYTES as usize]);
    buffer.extend_from_slice(&seq.to_le_bytes());
    buffer.extend_from_slice(&last_position.to_le_bytes());
    buffer.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for (key, value) in ops {
        buffer.push(u8::from(value.is_some()));
        buffer.extend_from_slice(&(key.len() as u32).to_le_bytes());
        buffer.extend_from_slice(key);
        values_at.push(value.as_ref().map(|value| {
            buffer.extend_from_slice(&(value.len() as u32).to_le_bytes());
            let start = buffer.len() as u64;
            buffer.extend_from_slice(value);
            (start, value.len() as u32)
        }));
    }
    let payload_len = (buffer.len() as u64 - FRAME_HEADER_BYTES) as u32;
    let crc = crc32fast::hash(&buffer[FRAME_HEADER_BYTES as usize..]);
    buffer[..4].copy_from_slice(&payload_len.to_le_bytes());
    buffer[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Checks that `path` starts as a journal segment.
fn read_header(path: &Path) -> Result<()> {
    let mut header = [0u8; HEADER_BYTES as usize];
    let file = File::open(path).map_err(|error| Error::io(path, error))?;
    file.read_exact_at(&mut header, 0)
        .map_err(|error| Error::io(path, error))?;
    match &header[..4] == MAGIC && matches!(header[4], FORMAT | FORMAT_1) {
        true => Ok(()),
        false => Err(Error::Corrupted {
            tree: "journal",
            key: format!("{}: not a journal segment", path.display()),
        }),
    }
}

/// A segment read back: its frames, where the next would go and the seq it would have.
struct ReadSegment {
    frames: Vec<JournalFrame>,
    end: u64,
    next_seq: u64,
}

/// The frames of the segment at `path`, named `first` (the seq of its first frame). A frame
/// that fails its CRC is, in order:
/// - a frame sled holds (its seq at or below `held`) followed by a whole frame or by the
///   segment's end: skipped. Its writes are in sled; only the log records in it are
///   damaged, which their own checksums find where they are read (S-4).
/// - in the newest segment with no whole frame after it: a write a crash cut before its
///   fsync, never acknowledged; the segment ends before it.
/// - anything else: damage that would lose acknowledged frames, which refuses the open.
///
/// `None`: the newest segment, created and never written whole.
fn read_segment(
    path: &Path,
    (first, held): (u64, u64),
    newest: bool,
) -> Result<Option<ReadSegment>> {
    let bytes = std::fs::read(path).map_err(|error| Error::io(path, error))?;
    let corrupt = |reason: String| damaged(path, &reason);
    if bytes.len() < HEADER_BYTES as usize
        || &bytes[..4] != MAGIC
        || !matches!(bytes[4], FORMAT | FORMAT_1)
    {
        return match newest && bytes.iter().all(|byte| *byte == 0) {
            // Created, not yet written whole: nothing in it was acknowledged.
            true => Ok(None),
            false => Err(corrupt("not a journal segment".into())),
        };
    }
    let mut frames = Vec::new();
    let (mut at, mut seq) = (HEADER_BYTES as usize, first);
    while let Some(header) = bytes.get(at..at + FRAME_HEADER_BYTES as usize) {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len == 0 {
            break;
        }
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let start = at + FRAME_HEADER_BYTES as usize;
        let payload = bytes.get(start..start + len);
        match payload.filter(|payload| crc32fast::hash(payload) == crc) {
            Some(payload) => {
                let payload_at = Location {
                    segment: first,
                    offset: start as u64,
                    len: 0,
                };
                let frame = decode(payload, payload_at)
                    .filter(|frame| frame.seq == seq)
                    .ok_or_else(|| corrupt(format!("frame at {at} does not follow")))?;
                frames.push(frame);
            }
            None if seq <= held && payload.is_some() && skippable(&bytes, start, len, held) => {}
            // Frames are written one after another, each fdatasynced before the next: only
            // the last written can be cut, so a whole frame after it is damage, not a cut.
            None if newest && !frame_after(&bytes, start, seq) => break,
            None => return Err(corrupt(format!("frame at {at} is cut or damaged"))),
        }
        (at, seq) = (start + len, seq + 1);
    }
    Ok(Some(ReadSegment {
        frames,
        end: at as u64,
        next_seq: seq,
    }))
}

/// Whether a damaged frame sled holds, whose payload of `len` bytes starts at `start`, can
/// be passed over: a whole frame follows it, or the segment ends there (a zero length, or
/// its last byte) with no whole frame of a seq sled lacks hiding after it.
fn skippable(bytes: &[u8], start: usize, len: usize, held: u64) -> bool {
    let next = start + len;
    let ends = match bytes.get(next..next.saturating_add(4)) {
        None => next == bytes.len(),
        Some(len) => len == [0; 4],
    };
    whole_frame_at(bytes, next) || (ends && !frame_after(bytes, start, held))
}

/// Whether a whole frame of a seq above `seq` starts anywhere after `from`: what a damaged
/// length would hide behind a frame that looks cut. Looked for only when one does.
fn frame_after(bytes: &[u8], from: usize, seq: u64) -> bool {
    let header = FRAME_HEADER_BYTES as usize;
    (from..bytes.len().saturating_sub(header + 8)).any(|at| {
        let seq_at = at + header;
        let later = bytes
            .get(seq_at..seq_at + 8)
            .and_then(|word| <[u8; 8]>::try_from(word).ok())
            .map(u64::from_le_bytes)
            .is_some_and(|found| found > seq && found - seq < 1 << 32);
        later && whole_frame_at(bytes, at)
    })
}

/// Whether a whole frame (its CRC holds) starts at `at`.
fn whole_frame_at(bytes: &[u8], at: usize) -> bool {
    let Some(header) = bytes.get(at..at.saturating_add(FRAME_HEADER_BYTES as usize)) else {
        return false;
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let start = at + FRAME_HEADER_BYTES as usize;
    len > 0
        && bytes
            .get(start..start.saturating_add(len))
            .is_some_and(|payload| crc32fast::hash(payload) == crc)
}

/// A frame's payload, which starts at `payload_at` (its segment and offset).
fn decode(payload: &[u8], payload_at: Location) -> Option<JournalFrame> {
    let mut reader = Reader(payload);
    let seq = reader.u64()?;
    let last_position = reader.u64()?;
    let count = reader.u32()? as usize;
    let mut ops = Vec::with_capacity(count.min(payload.len()));
    let mut locations = Vec::with_capacity(count.min(payload.len()));
    for _ in 0..count {
        let insert = reader.take(1)?[0] == 1;
        let key_len = reader.u32()? as usize;
        let key = reader.take(key_len)?.to_vec();
        let value = match insert {
            true => {
                let value_len = reader.u32()?;
                locations.push(Some(Location {
                    len: value_len,
                    offset: payload_at.offset + (payload.len() - reader.0.len()) as u64,
                    ..payload_at
                }));
                Some(reader.take(value_len as usize)?.to_vec())
            }
            false => {
                locations.push(None);
                None
            }
        };
        ops.push((key, value));
    }
    reader.0.is_empty().then_some(JournalFrame {
        seq,
        last_position,
        ops,
        locations,
    })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (taken, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(taken)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
