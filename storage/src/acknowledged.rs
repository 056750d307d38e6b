//! S-7: what the store acknowledged, kept apart from sled's files, so that an open can tell
//! when sled served less than it was given. sled 0.34.7's recovery cuts its log at the
//! first bad checksum and serves what is left, without a word: a damaged or truncated data
//! file would otherwise lose acknowledged executions silently.
//!
//! The file `acknowledged` beside sled's holds the highest log position acknowledged and
//! durable in sled, written and fsynced by the flusher once sled is synced through it (the
//! journal's last frame is the mark until then: an open counts both, `open.rs`, and raises
//! the file to it before the journal goes). At open, a store whose log ends
//! before that position refuses to open (`Error::AcknowledgedLost`) unless it is opened to
//! salvage (`Store::open_salvaging`), which lists what it can name and moves the mark down.
//!
//! Format 1, 64 bytes: two 32-byte slots written in turn, so a torn write leaves the other
//! slot whole. A slot is `b"OPAK"`, the format byte, 3 zero bytes, the generation (u64,
//! big-endian), the position (u64, big-endian), the CRC-32 of the 24 bytes before it (u32,
//! big-endian), 4 zero bytes. The slot with the highest generation whose CRC holds is the
//! mark. The file is created whole (written to `acknowledged.new`, fsynced, renamed).
//!
//! What this does not do: name the executions a loss touched (only what survives refers to
//! can be named, `SalvageReport`), nor protect against the loss of this file (a missing
//! file is created from what the store holds).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

const FILE_NAME: &str = "acknowledged";
const MAGIC: &[u8; 4] = b"OPAK";
const FORMAT: u8 = 1;
const SLOT_BYTES: usize = 32;

/// The mark's file of the sled store in `dir`.
pub(crate) fn in_store(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// S-7's rule, for every store: a log that ends at `present_through`, before a position
/// `acknowledged`, lost acknowledged history and is refused, unless it is opened to salvage.
/// Returns the acknowledged position lost, if any.
pub(crate) fn check(
    acknowledged: Option<u64>,
    present_through: u64,
    salvaging: bool,
) -> Result<Option<u64>> {
    let lost = acknowledged.filter(|acknowledged| *acknowledged > present_through);
    match (lost, salvaging) {
        (Some(acknowledged_through), false) => Err(Error::AcknowledgedLost {
            acknowledged_through,
            present_through,
        }),
        _ => Ok(lost),
    }
}

/// The acknowledged mark, and the file it is kept in.
#[derive(Debug)]
pub(crate) struct Acknowledged {
    file: File,
    path: PathBuf,
    generation: u64,
    position: u64,
}

impl Acknowledged {
    /// Reads the mark in the file `path`: `None` if there is no file yet.
    pub fn read(path: &Path) -> Result<Option<u64>> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(Error::io(path, error)),
        };
        newest(&bytes)
            .map(|(_, position)| Some(position))
            .ok_or_else(|| Error::AcknowledgedUnreadable {
                path: path.to_path_buf(),
            })
    }

    /// Opens the file `path` for the committer, writing `position` as the mark (a new file
    /// is created whole). Durable when this returns.
    pub fn open(path: &Path, position: u64) -> Result<Self> {
        let generation = match std::fs::read(path) {
            Ok(bytes) => newest(&bytes).map_or(0, |(generation, _)| generation),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                create(path)?;
                0
            }
            Err(error) => return Err(Error::io(path, error)),
        };
        let file = File::options()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|error| Error::io(path, error))?;
        let mut acknowledged = Self {
            file,
            path: path.to_path_buf(),
            generation,
            position,
        };
        acknowledged.write(position)?;
        Ok(acknowledged)
    }

    pub fn position(&self) -> u64 {
        self.position
    }

    /// Records `position` as acknowledged, durably (the other slot, then an fdatasync).
    pub fn write(&mut self, position: u64) -> Result<()> {
        let generation = self.generation + 1;
        let slot = slot(generation, position);
        let offset = (generation % 2) * SLOT_BYTES as u64;
        self.file
            .write_all_at(&slot, offset)
            .and_then(|()| self.file.sync_data())
            .map_err(|error| Error::io(&self.path, error))?;
        self.generation = generation;
        self.position = position;
        Ok(())
    }
}

/// Creates the file whole: two empty slots, written beside it, fsynced and renamed, and the
/// directory fsynced.
fn create(path: &Path) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut new = path.as_os_str().to_owned();
    new.push(".new");
    let new = PathBuf::from(new);
    let mut bytes = slot(0, 0).to_vec();
    bytes.extend_from_slice(&slot(0, 0));
    let mut file = File::create(&new).map_err(|error| Error::io(&new, error))?;
    file.write_all(&bytes)
        .and_then(|()| file.sync_all())
        .map_err(|error| Error::io(&new, error))?;
    std::fs::rename(&new, path).map_err(|error| Error::io(path, error))?;
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|error| Error::io(dir, error))
}

fn slot(generation: u64, position: u64) -> [u8; SLOT_BYTES] {
    let mut slot = [0u8; SLOT_BYTES];
    slot[..4].copy_from_slice(MAGIC);
    slot[4] = FORMAT;
    slot[8..16].copy_from_slice(&generation.to_be_bytes());
    slot[16..24].copy_from_slice(&position.to_be_bytes());
    let crc = crc32fast::hash(&slot[..24]);
    slot[24..28].copy_from_slice(&crc.to_be_bytes());
    slot
}

/// `(generation, position)` of a whole slot.
fn read_slot(slot: &[u8]) -> Option<(u64, u64)> {
    if slot.len() != SLOT_BYTES || &slot[..4] != MAGIC || slot[4] != FORMAT {
        return None;
    }
    let crc = u32::from_be_bytes(slot[24..28].try_into().ok()?);
    if crc32fast::hash(&slot[..24]) != crc {
        return None;
    }
    let generation = u64::from_be_bytes(slot[8..16].try_into().ok()?);
    let position = u64::from_be_bytes(slot[16..24].try_into().ok()?);
    Some((generation, position))
}

/// The newest whole slot of a file's bytes.
fn newest(bytes: &[u8]) -> Option<(u64, u64)> {
    bytes
        .chunks(SLOT_BYTES)
        .take(2)
        .filter_map(read_slot)
        .max_by_key(|(generation, _)| *generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// S-7: the mark survives a reopen; a torn or flipped slot leaves the other one; both
    /// damaged is an error, never a mark of zero.
    #[test]
    fn s7_the_mark_is_read_back_and_a_damaged_slot_falls_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = in_store(dir.path());
        assert_eq!(Acknowledged::read(&path).expect("read"), None);
        let mut mark = Acknowledged::open(&path, 5).expect("open");
        mark.write(9).expect("write");
        mark.write(12).expect("write");
        drop(mark);
        assert_eq!(Acknowledged::read(&path).expect("read"), Some(12));
        let mut bytes = std::fs::read(&path).expect("bytes");
        // The newest slot (generation 3: offset 32) flipped: the one before it stands.
        bytes[32 + 17] ^= 0x40;
        std::fs::write(&path, &bytes).expect("write");
        assert_eq!(Acknowledged::read(&path).expect("read"), Some(9));
        bytes[17] ^= 0x40;
        std::fs::write(&path, &bytes).expect("write");
        assert!(matches!(
            Acknowledged::read(&path),
            Err(Error::AcknowledgedUnreadable { .. })
        ));
    }
}
