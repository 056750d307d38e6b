//! The sled store's reads (`EventReader`): the overlay, then disk, read consistently, so a
//! materialization slice written meanwhile is never seen half; what a group in flight wrote
//! is not read. An execution's events come through its event index, the log's in position
//! order without purged executions (S-8).

use std::collections::hash_map::Entry;
use std::collections::BTreeSet;

use super::*;

impl Store {
    /// Reads the overlay, then disk, and retries if a materialization slice was written in
    /// between (see `overlay.rs`); after `READ_ATTEMPTS_MAX` tries it reads holding the slice
    /// lock, which no slice write can overlap.
    fn read_consistent<A, T>(
        &self,
        from_overlay: impl Fn(&Overlay) -> A,
        from_disk: impl Fn(A) -> Result<T>,
    ) -> Result<T> {
        let shared = self.shared();
        // What the overlay holds is not served after a close either.
        shared.check_open()?;
        for _ in 0..READ_ATTEMPTS_MAX {
            let before = shared.seqlock.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::thread::yield_now();
                continue; // a slice is being written
            }
            let seen = from_overlay(&shared.overlay_read());
            let result = from_disk(seen)?;
            if shared.seqlock.load(Ordering::Acquire) == before {
                return Ok(result);
            }
        }
        // No slice can be in flight while this is held.
        let _no_slice = shared.slice_lock_read();
        let seen = from_overlay(&shared.overlay_read());
        from_disk(seen)
    }

    fn record<T>(&self, key: [u8; 17]) -> Result<Option<T>>
    where
        RecordValue: TryInto<T>,
    {
        self.read_consistent(
            |overlay| overlay.record(&key).cloned(),
            |cached| {
                let on_disk = cached.is_none();
                let found = self.shared().record_or_disk(&key, cached)?;
                // A rejection's record written by the group being committed is not durable
                // yet: absent until it is. Disk first, then the in-flight set (which holds the
                // key from before the batch is applied until after the fsync), so a record
                // read from disk is checked against the set as it is afterwards.
                Ok(found.filter(|_| {
                    !(on_disk && lock(&self.shared().in_flight_records).contains(&key))
                }))
            },
        )
    }

    /// Every record under the key `prefix` that `pick` takes, the overlay's version first.
    /// A record that does not decode is returned as its error, by its key.
    fn records_of<T>(
        &self,
        prefix: u8,
        pick: fn(&RecordValue) -> Option<T>,
    ) -> Result<Vec<([u8; 17], Result<T>)>> {
        self.read_consistent(
            |overlay| overlay.records(pick),
            |overlay| {
                let mut found: std::collections::BTreeMap<[u8; 17], Result<T>> = overlay
                    .into_iter()
                    .map(|(key, record)| (key, Ok(record)))
                    .collect();
                for item in self.shared().db()?.scan_prefix([prefix]) {
                    let (key, bytes) = item?;
                    let Ok(key) = <[u8; 17]>::try_from(key.as_ref()) else {
                        return Err(Error::corrupted(&key));
                    };
                    if found.contains_key(&key) {
                        continue; // newer in the overlay
                    }
                    let record = codec::decode::<RecordValue>(&key, &bytes)
                        .and_then(|record| pick(&record).ok_or_else(|| Error::corrupted(&key)));
                    found.insert(key, record);
                }
                Ok(found.into_iter().collect())
            },
        )
    }

    /// Where the events of one execution with `seq > after_seq` are, from its event index on
    /// disk; stops once they cover `limit` events, so a page costs what it holds.
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
        let db = &self.shared().db()?;
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
        let db = &self.shared().db()?;
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
            let corrupted = || Error::corrupted(&record_key);
            let value = db.get(record_key)?.ok_or_else(corrupted)?;
            let shared = self.shared();
            let bytes = shared
                .history
                .record(&|key| shared.get(key), &record_key, value)?
                .ok_or_else(corrupted)?;
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
}

impl EventReader for Store {
    fn head(&self, execution_id: ExecutionId) -> Result<Option<ExecutionHead>> {
        self.shared().refusals.check_quarantine(execution_id)?;
        self.read_consistent(
            |overlay| overlay.current(execution_id).map(|(head, _)| head.clone()),
            |cached| match cached {
                Some(head) => Ok(Some(head)),
                None => self.shared().head_on_disk(execution_id),
            },
        )
    }

    fn events_after(
        &self,
        execution_id: ExecutionId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<EventEnvelope>> {
        self.shared().refusals.check_quarantine(execution_id)?;
        let result = self.read_consistent(
            |overlay| overlay.frame_refs_after(execution_id, after_seq),
            |pending| {
                let mut refs = self.frame_refs_on_disk(execution_id, after_seq, limit)?;
                refs.extend(pending);
                self.events_at(execution_id, refs, after_seq, limit)
            },
        );
        self.shared().quarantine_on_corruption(execution_id, result)
    }

    fn log_after(&self, after_position: u64, limit: usize) -> Result<Vec<EventEnvelope>> {
        let shared = self.shared();
        shared.check_open()?;
        let durable = self.durable_position();
        if after_position >= durable || limit == 0 {
            return Ok(Vec::new());
        }
        let db = &shared.db()?;
        let start = db
            .range(keys::log(0)..=keys::log(after_position + 1))
            .next_back();
        let start = start.transpose()?.map(|(key, _)| key);
        let start = start.unwrap_or_else(|| sled::IVec::from(&keys::log(0)[..]));
        let mut events = Vec::new();
        let mut purged = std::collections::HashMap::new();
        for item in db.range(start..=sled::IVec::from(&keys::log(durable)[..])) {
            let (key, value) = item?;
            // Gone since the range was read: swept, its executions purged.
            let Some(value) = shared.history.record(&|key| shared.get(key), &key, value)? else {
                continue;
            };
            for frame in codec::decode_log_record(&key, &value)?.frames {
                match frame {
                    DecodedFrame::Ok(mut frame) => {
                        let wanted = |event: &EventEnvelope| {
                            event.position > after_position && event.position <= durable
                        };
                        if !frame.events.iter().any(wanted) {
                            continue;
                        }
                        let gone = match purged.entry(frame.execution_id) {
                            Entry::Occupied(known) => *known.get(),
                            Entry::Vacant(entry) => {
                                *entry.insert(db.contains_key(keys::purged(frame.execution_id))?)
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

    fn command(&self, command_id: CommandId) -> Result<Option<CommandRecord>> {
        self.record(keys::command(command_id))
    }

    fn receipt(&self, effect_id: EffectId) -> Result<Option<ReceiptRecord>> {
        self.record(keys::receipt(effect_id))
    }

    fn wait(&self, wait_id: WaitId) -> Result<Option<WaitRecord>> {
        self.record(keys::wait(wait_id))
    }

    fn process(&self, process_id: ProcessId) -> Result<Option<ProcessRecord>> {
        self.record(keys::process(process_id))
    }

    fn job(&self, job_id: ExecutionId) -> Result<Option<JobRecord>> {
        self.record(keys::job(job_id))
    }

    fn session(&self, session_id: SessionId) -> Result<Option<crate::records::SessionRecord>> {
        self.record(keys::session(session_id))
    }

    fn conversation(
        &self,
        session_id: SessionId,
    ) -> Result<Option<crate::conversation::ConversationRecord>> {
        // Written straight to its key by the committer, never through the overlay.
        // Disk first, then the group in flight (its entry made before its batch is applied,
        // dropped after the fsync): while it rewrites the record, its durable value is read.
        let key = keys::conversation(session_id);
        let on_disk = self.shared().db()?.get(key)?;
        let overwritten = lock(&self.shared().in_flight_overwrites).get(&key).cloned();
        let bytes = overwritten.unwrap_or(on_disk);
        bytes.map(|bytes| codec::decode(&key, &bytes)).transpose()
    }

    fn projection(&self, execution_id: ExecutionId) -> Result<Option<ProjectionRecord>> {
        self.shared().refusals.check_quarantine(execution_id)?;
        self.record(keys::projection(execution_id))
    }

    fn purged(&self, execution_id: ExecutionId) -> Result<Option<PurgedRecord>> {
        let key = keys::purged(execution_id);
        let bytes = self.shared().db()?.get(key)?;
        bytes.map(|bytes| codec::decode(&key, &bytes)).transpose()
    }

    fn ended_before(
        &self,
        before_ms: u64,
        after: Option<(u64, ExecutionId)>,
        limit: usize,
    ) -> Result<Vec<(u64, ExecutionId)>> {
        let db = &self.shared().db()?;
        let nil = ExecutionId::from_uuid(uuid::Uuid::nil());
        let end = keys::ended(before_ms, nil);
        let (at, execution_id) = after.unwrap_or((0, nil));
        let start = keys::ended(at, execution_id);
        let mut ended = Vec::new();
        for item in db.range(&start[..]..&end[..]) {
            if ended.len() >= limit {
                break;
            }
            let (key, _) = item?;
            let parts = keys::ended_parts(&key);
            if parts.is_some_and(|parts| Some(parts) != after) {
                ended.extend(parts);
            }
        }
        Ok(ended)
    }

    fn purges_unfinished(&self) -> Result<Vec<ExecutionId>> {
        let mut unfinished = Vec::new();
        for item in self.shared().db()?.scan_prefix([keys::PURGED]) {
            let (key, value) = item?;
            let record: PurgedRecord = codec::decode(&key, &value)?;
            if !record.finished {
                unfinished.push(record.execution_id);
            }
        }
        Ok(unfinished)
    }

    fn disk_bytes(&self) -> u64 {
        crate::sled_db::disk_bytes(&self.shared().path)
    }

    fn executions_in_session(&self, session_id: SessionId) -> Result<Vec<ExecutionId>> {
        self.read_consistent(
            |overlay| overlay.in_session(session_id),
            |held| {
                let mut found: BTreeSet<ExecutionId> = held.into_iter().collect();
                for item in self
                    .shared()
                    .db()?
                    .scan_prefix(keys::by_session_prefix(session_id))
                {
                    let (key, _) = item?;
                    let execution_id =
                        keys::execution_at(&key, 17).ok_or_else(|| Error::corrupted(&key))?;
                    found.insert(execution_id);
                }
                Ok(found.into_iter().collect())
            },
        )
    }

    fn sessions(&self) -> Result<Vec<(SessionId, usize)>> {
        self.read_consistent(
            |overlay| overlay.sessions(),
            |held| {
                let mut found: std::collections::BTreeMap<SessionId, BTreeSet<ExecutionId>> =
                    std::collections::BTreeMap::new();
                for (session_id, execution_id) in held {
                    found.entry(session_id).or_default().insert(execution_id);
                }
                for item in self.shared().db()?.scan_prefix([keys::BY_SESSION]) {
                    let (key, _) = item?;
                    let corrupted = || Error::corrupted(&key);
                    let session_id = keys::session_at(&key, 1).ok_or_else(corrupted)?;
                    let execution_id = keys::execution_at(&key, 17).ok_or_else(corrupted)?;
                    found.entry(session_id).or_default().insert(execution_id);
                }
                Ok(found.into_iter().map(|(id, all)| (id, all.len())).collect())
            },
        )
    }

    fn processes(&self) -> Result<Vec<ProcessRecord>> {
        let found = self.records_of(keys::PROCESS, |record| match record {
            RecordValue::Process(process) => Some(process.clone()),
            _ => None,
        })?;
        found.into_iter().map(|(_, process)| process).collect()
    }

    fn policies(&self) -> Result<crate::policy::Policies> {
        let found = self.records_of(keys::POLICY, |record| match record {
            RecordValue::Policy(policy) => Some(policy.restart_window),
            _ => None,
        })?;
        let found = (found.into_iter())
            .map(|(key, window)| (key, window.map_err(|error| error.to_string())));
        Ok(crate::policy::Policies::of(found, |key| {
            keys::execution_at(key, 1)
        }))
    }

    fn blob(&self, hash: BlobHash) -> Result<Option<Vec<u8>>> {
        // Read first, then ask whether it is in flight: the other order could miss a blob
        // the committer inserted (not yet durable) between the two.
        let found = self.shared().blob_on_disk(hash)?;
        let in_flight = lock(&self.shared().in_flight_blobs).contains(&hash);
        Ok(found.filter(|_| !in_flight))
    }

    fn executions_in_state(&self, state: ExecutionState) -> Result<Vec<ExecutionId>> {
        if state.is_terminal() {
            return Ok(Vec::new());
        }
        self.read_consistent(
            |overlay| overlay.state_changes(state),
            |(added, removed)| {
                let mut found = BTreeSet::new();
                for item in self
                    .shared()
                    .db()?
                    .scan_prefix(keys::by_state_prefix(state))
                {
                    let (key, _) = item?;
                    let execution_id =
                        keys::execution_at(&key, 2).ok_or_else(|| Error::corrupted(&key))?;
                    found.insert(execution_id);
                }
                for execution_id in removed {
                    found.remove(&execution_id);
                }
                found.extend(added);
                Ok(found.into_iter().collect())
            },
        )
    }

    fn quarantined(&self) -> Vec<(ExecutionId, String)> {
        self.shared().refusals.quarantined()
    }

    fn incarnation(&self) -> &Incarnation {
        &self.inner.incarnation
    }

    fn metrics(&self) -> MetricsSnapshot {
        let queued = self.inner.sender.as_ref().map_or(0, |sender| {
            (sender.max_capacity() - sender.capacity()) as u64
        });
        self.shared().metrics.snapshot(1, queued)
    }

    fn histograms(&self) -> Vec<crate::NamedHistogram> {
        self.shared().metrics.histograms()
    }

    fn log_end(&self) -> Result<u64> {
        self.shared().check_open()?;
        Ok(self.durable_position())
    }

    fn failure(&self) -> Option<String> {
        self.shared().refusals.failure()
    }
}
