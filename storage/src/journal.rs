//! One device wait per group commit (S-3, issue 56): the committer appends each group's
//! writes to this journal and fdatasyncs it once, then applies them to sled in memory and
//! answers; sled is flushed and fsynced in the background (`log/flusher.rs`), after which
//! the segments it holds go. An open replays every frame kept (`open.rs`), and the last
//! frame is the acknowledged mark (S-7) until the flusher records it.
//!
//! Files: `DIR/journal/{first seq:020}.wal`, each sized up front (sparse). A segment is
//! `b"OPJL"`, the format byte, 3 zero bytes, then frames: the payload's length (u32,
//! little-endian; 0 ends the segment), the CRC-32 of the payload (u32, little-endian), the
//! payload: the group's seq (u64), its last log position (u64), the number of writes (u32),
//! each write a tag (1 insert, 0 remove), the key's length (u32) and key, and for an insert
//! the value's length (u32) and value — all little-endian. A frame that ends the newest
//! segment short or fails its CRC is a write a crash cut: it was never fsynced, so never
//! acknowledged, and the journal ends before it. The same in any earlier place refuses the
//! open (`Error::Corrupted`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use sled::IVec;

use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"OPJL";
const FORMAT: u8 = 1;
const HEADER_BYTES: u64 = 8;
/// A frame's length and CRC, before its payload.
const FRAME_HEADER_BYTES: u64 = 8;
/// A segment's size, set when it is created, so a frame's fdatasync changes no file size.
pub(crate) const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// A group's writes, in the order they were made: a journal frame, then sled's (key by key,
/// or as one batch, `batch_of`).
#[derive(Debug, Default)]
pub(crate) struct Writes {
    ops: Vec<(IVec, Option<IVec>)>,
}

impl Writes {
    pub fn insert<K: Into<IVec>, V: Into<IVec>>(&mut self, key: K, value: V) {
        self.ops.push((key.into(), Some(value.into())));
    }

    pub fn remove<K: Into<IVec>>(&mut self, key: K) {
        self.ops.push((key.into(), None));
    }

    pub fn into_ops(self) -> Vec<(IVec, Option<IVec>)> {
        self.ops
    }
}

/// Writes as one sled batch (a later write of a key wins, as when applied one by one).
pub(crate) fn batch_of<K: AsRef<[u8]>, V: AsRef<[u8]>>(ops: &[(K, Option<V>)]) -> sled::Batch {
    let mut batch = sled::Batch::default();
    for (key, value) in ops {
        match value {
            Some(value) => batch.insert(key.as_ref(), value.as_ref()),
            None => batch.remove(key.as_ref()),
        }
    }
    batch
}

/// One frame read back: a group's writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JournalFrame {
    pub seq: u64,
    pub last_position: u64,
    pub ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// The segment being appended to, and the older ones still needed.
#[derive(Debug)]
pub(crate) struct Journal {
    dir: PathBuf,
    file: File,
    /// Where the next frame goes in `file`.
    offset: u64,
    /// Every segment, oldest first: its first seq and path (the last is `file`'s).
    segments: Vec<(u64, PathBuf)>,
    /// The seq of the next frame.
    next_seq: u64,
    /// The encoding buffer, kept between frames.
    buffer: Vec<u8>,
}

impl Journal {
    /// Opens the journal in `dir` (created if missing): its frames, oldest first, and the
    /// journal to append to, its next seq after every frame and segment.
    pub fn open(dir: &Path) -> Result<(Self, Vec<JournalFrame>)> {
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
        let mut frames = Vec::new();
        // Where the newest segment's next frame goes; `None`: a new segment is made.
        let mut end = None;
        for (index, (first, path)) in names.iter().enumerate() {
            let newest = index + 1 == names.len();
            match read_segment(path, newest)? {
                Some((read, offset)) => {
                    // Seqs follow one another, within and across segments, from the name.
                    let expected = frames
                        .last()
                        .map_or(*first, |last: &JournalFrame| last.seq + 1);
                    let gap = read
                        .first()
                        .is_some_and(|frame| frame.seq != expected || frame.seq != *first)
                        || read.windows(2).any(|pair| pair[1].seq != pair[0].seq + 1);
                    if gap {
                        return Err(Error::Corrupted {
                            tree: "journal",
                            key: format!(
                                "{}: its frames do not follow the journal's",
                                path.display()
                            ),
                        });
                    }
                    frames.extend(read);
                    end = newest.then_some(offset);
                }
                // Created and not yet written whole (a crash then): made again below.
                None => std::fs::remove_file(path).map_err(|error| Error::io(path, error))?,
            }
        }
        if end.is_none() {
            names.pop_if(|(_, path)| !path.exists());
        }
        // A segment's name is the seq of its first frame, written or to come.
        let named = names.last().map_or(1, |(first, _)| *first);
        let next_seq = frames
            .last()
            .map_or(named, |frame: &JournalFrame| frame.seq + 1);
        let journal = match (names.last(), end) {
            (Some((_, path)), Some(offset)) => Journal {
                file: open_rw(path)?,
                dir: dir.to_path_buf(),
                offset,
                segments: names,
                next_seq,
                buffer: Vec::new(),
            },
            _ => Journal::create(dir, next_seq, names)?,
        };
        Ok((journal, frames))
    }

    /// A journal whose newest segment is a new one starting at `next_seq`.
    fn create(dir: &Path, next_seq: u64, mut segments: Vec<(u64, PathBuf)>) -> Result<Self> {
        let path = dir.join(format!("{next_seq:020}.wal"));
        let file = open_rw(&path)?;
        // Whatever a file of that name held (a segment left with no whole frame) goes.
        file.set_len(0).map_err(|error| Error::io(&path, error))?;
        let mut header = [0u8; HEADER_BYTES as usize];
        header[..4].copy_from_slice(MAGIC);
        header[4] = FORMAT;
        let io = |error| Error::io(&path, error);
        file.write_all_at(&header, 0).map_err(io)?;
        match file.set_len(SEGMENT_BYTES) {
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
        segments.push((next_seq, path));
        Ok(Journal {
            dir: dir.to_path_buf(),
            file,
            offset: HEADER_BYTES,
            segments,
            next_seq,
            buffer: Vec::new(),
        })
    }

    /// The seq the next appended frame gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Appends a group's writes as the next frame and makes it durable (`write`, then `sync`).
    #[cfg(test)]
    pub fn append(&mut self, last_position: u64, ops: &[(IVec, Option<IVec>)]) -> Result<u64> {
        let (seq, _) = self.write(last_position, ops)?;
        self.sync()?;
        Ok(seq)
    }

    /// Writes a group's writes as the next frame (a new segment when this one is full), not
    /// yet durable. Returns the frame's seq and size in bytes.
    pub fn write(
        &mut self,
        last_position: u64,
        ops: &[(IVec, Option<IVec>)],
    ) -> Result<(u64, u64)> {
        let seq = self.next_seq;
        encode(&mut self.buffer, seq, last_position, ops);
        let frame_bytes = self.buffer.len() as u64;
        if self.offset + frame_bytes > SEGMENT_BYTES && self.offset > HEADER_BYTES {
            let segments = std::mem::take(&mut self.segments);
            let buffer = std::mem::take(&mut self.buffer);
            *self = Journal::create(&self.dir, seq, segments)?;
            self.buffer = buffer;
        }
        // A group larger than a segment grows the file (its size is synced with it).
        let path = &self.segments[self.segments.len() - 1].1;
        let io = |error| Error::io(path, error);
        self.file
            .write_all_at(&self.buffer, self.offset)
            .map_err(io)?;
        self.offset += frame_bytes;
        self.next_seq += 1;
        Ok((seq, frame_bytes))
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

    /// Removes the segments whose every frame is at or below `durable_seq` (sled holds them
    /// durably), never the one being appended to.
    pub fn drop_through(&mut self, durable_seq: u64) -> Result<()> {
        let mut dropped = false;
        while self.segments.len() > 1 && self.segments[1].0 <= durable_seq.saturating_add(1) {
            let (_, path) = self.segments.remove(0);
            std::fs::remove_file(&path).map_err(|error| Error::io(&path, error))?;
            dropped = true;
        }
        match dropped {
            true => sync_dir(&self.dir),
            false => Ok(()),
        }
    }

    /// Starts afresh after everything before `next_seq` is durable in sled (a clean close):
    /// one empty segment.
    /// The segments go oldest first and the directory is synced before the new one exists:
    /// cut short, what is left is still a journal whose newest segment is its newest.
    pub fn reset(&mut self) -> Result<()> {
        for (_, path) in std::mem::take(&mut self.segments) {
            std::fs::remove_file(&path).map_err(|error| Error::io(&path, error))?;
        }
        sync_dir(&self.dir)?;
        *self = Journal::create(&self.dir, self.next_seq, Vec::new())?;
        Ok(())
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

/// Encodes a frame into `buffer` (cleared first).
fn encode(buffer: &mut Vec<u8>, seq: u64, last_position: u64, ops: &[(IVec, Option<IVec>)]) {
    buffer.clear();
    buffer.extend_from_slice(&[0u8; FRAME_HEADER_BYTES as usize]);
    buffer.extend_from_slice(&seq.to_le_bytes());
    buffer.extend_from_slice(&last_position.to_le_bytes());
    buffer.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for (key, value) in ops {
        buffer.push(u8::from(value.is_some()));
        buffer.extend_from_slice(&(key.len() as u32).to_le_bytes());
        buffer.extend_from_slice(key);
        if let Some(value) = value {
            buffer.extend_from_slice(&(value.len() as u32).to_le_bytes());
            buffer.extend_from_slice(value);
        }
    }
    let payload_len = (buffer.len() as u64 - FRAME_HEADER_BYTES) as u32;
    let crc = crc32fast::hash(&buffer[FRAME_HEADER_BYTES as usize..]);
    buffer[..4].copy_from_slice(&payload_len.to_le_bytes());
    buffer[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// The frames of one segment, and where the next would go. `newest`: a cut frame ends it
/// (a crash before its fsync), and `None` is a segment created and never written whole;
/// elsewhere either refuses the open.
fn read_segment(path: &Path, newest: bool) -> Result<Option<(Vec<JournalFrame>, u64)>> {
    let bytes = std::fs::read(path).map_err(|error| Error::io(path, error))?;
    let corrupt = |reason: String| Error::Corrupted {
        tree: "journal",
        key: format!("{}: {reason}", path.display()),
    };
    if bytes.len() < HEADER_BYTES as usize || &bytes[..4] != MAGIC || bytes[4] != FORMAT {
        return match newest && bytes.iter().all(|byte| *byte == 0) {
            // Created, not yet written whole: nothing in it was acknowledged.
            true => Ok(None),
            false => Err(corrupt("not a journal segment of format 1".into())),
        };
    }
    let mut frames = Vec::new();
    let mut at = HEADER_BYTES as usize;
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
                let frame = decode(payload).ok_or_else(|| corrupt(format!("frame at {at}")))?;
                frames.push(frame);
                at = start + len;
            }
            // Frames are written one after another, each fdatasynced before the next: only
            // the last written can be cut, so a whole frame after it is damage, not a cut.
            None if newest && !whole_frame_at(&bytes, start + len) => break,
            None => return Err(corrupt(format!("frame at {at} is cut or damaged"))),
        }
    }
    Ok(Some((frames, at as u64)))
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

fn decode(payload: &[u8]) -> Option<JournalFrame> {
    let mut reader = Reader(payload);
    let seq = reader.u64()?;
    let last_position = reader.u64()?;
    let count = reader.u32()? as usize;
    let mut ops = Vec::with_capacity(count.min(payload.len()));
    for _ in 0..count {
        let insert = reader.take(1)?[0] == 1;
        let key_len = reader.u32()? as usize;
        let key = reader.take(key_len)?.to_vec();
        let value = match insert {
            true => {
                let value_len = reader.u32()? as usize;
                Some(reader.take(value_len)?.to_vec())
            }
            false => None,
        };
        ops.push((key, value));
    }
    reader.0.is_empty().then_some(JournalFrame {
        seq,
        last_position,
        ops,
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
mod tests {
    use super::*;

    fn ops(n: u8) -> Vec<(IVec, Option<IVec>)> {
        vec![
            (IVec::from(&[n][..]), Some(IVec::from(vec![n; 40]))),
            (IVec::from(&[n, 1][..]), None),
        ]
    }

    #[test]
    fn s3_frames_read_back_in_order_across_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut journal, frames) = Journal::open(dir.path()).expect("open");
        assert!(frames.is_empty());
        for n in 1..=3 {
            let seq = journal.append(u64::from(n) * 10, &ops(n)).expect("append");
            assert_eq!(seq, u64::from(n));
        }
        drop(journal);
        let (journal, frames) = Journal::open(dir.path()).expect("reopen");
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[2].seq, 3);
        assert_eq!(frames[2].last_position, 30);
        assert_eq!(frames[2].ops[0], (vec![3], Some(vec![3; 40])));
        assert_eq!(frames[2].ops[1], (vec![3, 1], None));
        assert_eq!(journal.next_seq(), 4);
    }

    #[test]
    fn s3_a_cut_last_frame_ends_the_journal_and_one_in_an_older_segment_refuses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut journal, _) = Journal::open(dir.path()).expect("open");
        journal.append(1, &ops(1)).expect("append");
        journal.append(2, &ops(2)).expect("append");
        let path = journal.segments[0].1.clone();
        drop(journal);
        // The second frame's last byte flipped: a write the crash cut.
        let bytes = std::fs::read(&path).expect("read");
        let end = bytes.iter().rposition(|byte| *byte != 0).expect("written");
        let file = open_rw(&path).expect("open");
        file.write_all_at(&[bytes[end] ^ 0xFF], end as u64)
            .expect("flip");
        let (mut journal, frames) = Journal::open(dir.path()).expect("reopen");
        assert_eq!(frames.len(), 1);
        // Appended after: the cut frame is overwritten.
        journal.append(3, &ops(3)).expect("append");
        let (mut journal, frames) = Journal::open(dir.path()).expect("reopen");
        assert_eq!(
            frames.iter().map(|frame| frame.seq).collect::<Vec<_>>(),
            [1, 2]
        );
        // In a segment that is not the newest, the same damage refuses the open.
        journal.reset().expect("reset");
        journal.append(4, &ops(4)).expect("append");
        let old = journal.segments[0].1.clone();
        let copy = dir.path().join(format!("{:020}.wal", 0));
        std::fs::copy(&old, &copy).expect("an older segment");
        let bytes = std::fs::read(&copy).expect("read");
        let file = open_rw(&copy).expect("open");
        file.write_all_at(&[bytes[20] ^ 0xFF], 20).expect("flip");
        assert!(matches!(
            Journal::open(dir.path()),
            Err(Error::Corrupted { .. })
        ));
        std::fs::remove_file(&copy).expect("remove");
        assert!(old.exists());
    }

    #[test]
    fn s7_a_damaged_frame_followed_by_a_whole_one_refuses_even_in_the_newest_segment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut journal, _) = Journal::open(dir.path()).expect("open");
        for n in 1..=3 {
            journal.append(u64::from(n), &ops(n)).expect("append");
        }
        let path = journal.segments[0].1.clone();
        drop(journal);
        // A byte of the first frame's payload: frames 2 and 3 are whole after it, so it was
        // not cut by a crash (only the last written can be); acknowledged frames would be lost.
        let at = (HEADER_BYTES + FRAME_HEADER_BYTES + 2) as usize;
        let bytes = std::fs::read(&path).expect("read");
        open_rw(&path)
            .expect("open")
            .write_all_at(&[bytes[at] ^ 0xFF], at as u64)
            .expect("flip");
        assert!(matches!(
            Journal::open(dir.path()),
            Err(Error::Corrupted { .. })
        ));
    }

    #[test]
    fn s3_segments_sled_holds_are_removed_and_never_the_newest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut journal, _) = Journal::open(dir.path()).expect("open");
        let big = vec![(IVec::from(&b"k"[..]), Some(IVec::from(vec![7u8; 20 << 20])))];
        for position in 1..=5 {
            journal.append(position, &big).expect("append");
        }
        assert!(journal.segments.len() >= 2, "{:?}", journal.segments);
        let newest = journal.segments.last().cloned().expect("newest");
        journal.drop_through(u64::MAX).expect("drop");
        assert_eq!(journal.segments, std::slice::from_ref(&newest));
        assert!(newest.1.exists());
        let (_, frames) = Journal::open(dir.path()).expect("reopen");
        assert!(frames.iter().all(|frame| frame.seq >= newest.0));
        assert_eq!(frames.last().map(|frame| frame.seq), Some(5));
    }
}
