//! The store's reads of histories: an execution's events through its event index, and the
//! whole log in position order (`EventReader::events_after`, `log_after`).

use std::collections::BTreeSet;

use super::*;

impl Store {
    /// Where the events of one execution with `seq > after_seq` are, from its event index
    /// on disk.
    /// Stops once the refs cover `limit` events, so paging through a long history costs
    /// what a page holds.
    pub(super) fn frame_refs_on_disk(
        &self,
        execution_id: ExecutionId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<FrameRef>> {
        let Some((_, index)) = self.shared().head_record_on_disk(execution_id)? else {
            return Ok(Vec::new());
        };
        let in_tail = |frame_ref: &&FrameRef| frame_ref.last_seq > after_seq;
        if after_seq >= index.chunked_through {
            // Everything after `after_seq` is in the head record: no chunk to look for.
            return Ok(index.tail.iter().filter(in_tail).copied().collect());
        }
        let db = &self.shared().db;
        let first = keys::events(execution_id, 0);
        let last = keys::events(execution_id, u64::MAX);
        // The index chunk covering `after_seq + 1` starts at or before it (from the start,
        // that is the first chunk: no need to look back for it).
        let start = match after_seq {
            0 => None,
            _ => db
                .range(first..=keys::events(execution_id, after_seq.saturating_add(1)))
                .next_back()
                .transpose()?
                .map(|(key, _)| key),
        }
        .unwrap_or_else(|| sled::IVec::from(&first[..]));
        let mut refs = Vec::new();
        for item in db.range(start..=sled::IVec::from(&last[..])) {
            let (key, value) = item?;
            let chunk: Vec<FrameRef> = codec::decode(&key, &value)?;
            refs.extend(
                chunk
                    .into_iter()
                    .filter(|frame_ref| frame_ref.last_seq > after_seq),
            );
            let covered = refs
                .last()
                .map_or(0, |newest| newest.last_seq.saturating_sub(after_seq));
            if covered >= limit as u64 {
                return Ok(refs);
            }
        }
        refs.extend(index.tail.iter().filter(in_tail));
        Ok(refs)
    }

    /// Reads the events the frame refs point at, decoding only this execution's frames of
    /// each log record; `seq > after_seq`, in order, each once, at most `limit`.
    pub(super) fn events_at(
        &self,
        execution_id: ExecutionId,
        mut refs: Vec<FrameRef>,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<EventEnvelope>> {
        let db = &self.shared().db;
        refs.sort_by_key(|frame_ref| frame_ref.first_seq);
        let mut events: Vec<EventEnvelope> = Vec::new();
        let mut records_read = BTreeSet::new();
        for frame_ref in refs {
            if events.len() >= limit {
                break;
            }
            if !records_read.insert(frame_ref.record) {
                continue; // that record's frames of this execution are read already
            }
            let record_key = keys::log(frame_ref.record);
            let corrupted = || Error::Corrupted {
                tree: "log",
                key: keys::display(&record_key),
            };
            let bytes = db.get(record_key)?.ok_or_else(corrupted)?;
            for frame in codec::decode_frames(&record_key, &bytes, Some(execution_id))?.frames {
                let DecodedFrame::Ok(mut frame) = frame else {
                    return Err(corrupted());
                };
                if !frame.resolve_blobs(|hash| self.shared().blob_on_disk(hash))? {
                    return Err(corrupted());
                }
                for event in frame.events {
                    let newest = events.last().map_or(after_seq, |last| last.seq);
                    if event.seq > newest {
                        events.push(event);
                    }
                }
            }
        }
        events.truncate(limit);
        Ok(events)
    }

    /// `EventReader::log_after`; a purged execution's events are not read (S-8), here
    /// either.
    pub(super) fn read_log_after(
        &self,
        after_position: u64,
        limit: usize,
    ) -> Result<Vec<EventEnvelope>> {
        let shared = self.shared();
        let durable = self.durable_position();
        if after_position >= durable || limit == 0 {
            return Ok(Vec::new());
        }
        let db = &shared.db;
        let start = match db
            .range(keys::log(0)..=keys::log(after_position + 1))
            .next_back()
        {
            Some(item) => item?.0,
            None => sled::IVec::from(&keys::log(0)[..]),
        };
        let mut events = Vec::new();
        let mut purged = std::collections::HashMap::new();
        for item in db.range(start..=sled::IVec::from(&keys::log(durable)[..])) {
            let (key, value) = item?;
            for frame in codec::decode_log_record(&key, &value)?.frames {
                match frame {
                    DecodedFrame::Ok(mut frame) => {
                        let wanted = |event: &EventEnvelope| {
                            event.position > after_position && event.position <= durable
                        };
                        if !frame.events.iter().any(wanted) {
                            continue;
                        }
                        let gone = match purged.get(&frame.execution_id) {
                            Some(gone) => *gone,
                            None => {
                                let gone = db.contains_key(keys::purged(frame.execution_id))?;
                                purged.insert(frame.execution_id, gone);
                                gone
                            }
                        };
                        if gone {
                            continue;
                        }
                        // A damaged blob, like a missing one, quarantines its execution: the
                        // global log goes on for the others.
                        let resolved =
                            frame.resolve_blobs(|hash| match self.shared().blob_on_disk(hash) {
                                Err(Error::Corrupted { .. }) => Ok(None),
                                other => other,
                            })?;
                        if !resolved {
                            let why = "names a blob that is not there";
                            shared.quarantine_frame(frame.execution_id, &key, why);
                            continue;
                        }
                        events.extend(frame.events.into_iter().filter(wanted))
                    }
                    DecodedFrame::Corrupt { claimed } => {
                        shared.quarantine_frame(claimed, &key, "is corrupted")
                    }
                }
            }
            if events.len() >= limit {
                break;
            }
        }
        events.truncate(limit);
        Ok(events)
    }
}
