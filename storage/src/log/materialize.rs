//! The committer's half of materialization (`overlay.rs`): when one starts and what part of
//! it each group writes, and the whole of it when the store closes.

use super::*;

/// A materialization is written in at most this many slices (see `Committer::next_slice`).
const MATERIALIZE_SLICES_TARGET: usize = 32;

impl Committer {
    /// Starts a materialization when one is due, and picks the part of it this group
    /// writes: `materialize_slice_len` entries or a 32nd of the materialization,
    /// whichever is more, or all of it when new commits have filled `active` to
    /// `overlay_len_max` meanwhile (the bound on the overlay's memory wins over a smooth
    /// latency).
    pub(super) fn next_slice(&mut self) -> Slice {
        let limits = &self.shared.limits;
        let due = {
            let overlay = self.shared.overlay_read();
            !overlay.is_materializing()
                && overlay.active_len() > 0
                && (overlay.active_len() >= limits.overlay_len_max
                    || self.last_materialization.elapsed()
                        >= Duration::from_millis(limits.materialize_interval_ms))
        };
        if due {
            let through = self.shared.durable_position.load(Ordering::Acquire);
            self.shared.overlay_write().freeze(through);
            self.shared
                .metrics
                .materializations
                .fetch_add(1, Ordering::Relaxed);
            self.last_materialization = Instant::now();
        }
        let overlay = self.shared.overlay_read();
        let len_max = if overlay.active_len() >= limits.overlay_len_max {
            usize::MAX
        } else {
            // Fast enough that a materialization ends within a few groups even when many
            // executions are dirty; small enough that no single group pays for all of it.
            limits
                .materialize_slice_len
                .max(overlay.frozen_len_at_freeze() / MATERIALIZE_SLICES_TARGET)
        };
        overlay.slice(len_max)
    }

    /// Writes everything the overlay holds (when the store closes), so the next open
    /// replays nothing.
    pub(super) fn materialize_all(&mut self) -> Result<()> {
        let mut batch = Writes::default();
        let through = self.shared.durable_position.load(Ordering::Acquire);
        let shared = Arc::clone(&self.shared);
        let on_disk = |execution_id| shared.head_index_on_disk(execution_id);
        shared
            .overlay_read()
            .write_all(&mut batch, through, &on_disk)?;
        let shared = Arc::clone(&self.shared);
        let db = shared.db()?;
        let _slice_guard = shared.slice_lock_write();
        shared.seqlock.fetch_add(1, Ordering::AcqRel);
        db.apply_batch(batch_of(&batch.into_ops()))?;
        self.flushing.sync(&self.shared)?;
        *self.shared.overlay_write() = Overlay::new(self.shared.limits.head_frame_refs_max);
        self.shared.seqlock.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}
