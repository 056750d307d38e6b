//! The committer's half of sled's generations (`generation.rs`): it starts a copy when sled's
//! files have doubled since the last one, forwards each group's writes to it, and switches
//! to the copy between two groups once it is done.

use std::sync::mpsc::TryRecvError;
use std::time::{Duration, Instant};

use super::*;
use crate::codec;
use crate::generation::{self, Built, Copying, Ops};

/// What the committer knows of sled's generations.
pub(super) struct Generations {
    copying: Option<Copying>,
    /// The size of sled's files after the last copy (0 before the first).
    base_bytes: u64,
    checked: Instant,
}

impl Generations {
    /// At open, how much of sled's files is live is not known (a store upgraded from before
    /// generations may be mostly garbage): the first copy comes once they pass
    /// `Limits::sled_copy_min_growth_bytes`, and tells.
    pub fn new() -> Self {
        Generations {
            copying: None,
            base_bytes: 0,
            checked: Instant::now(),
        }
    }

    /// Hands a group's writes, as sled took them, to the copy under way.
    pub fn forward(&self, ops: &Ops) {
        if let Some(copying) = &self.copying {
            // A copy that stopped says why through `done`.
            let _ = copying.forward.send(ops.clone());
        }
    }

    /// Stops a copy under way (the store closes).
    pub fn abandon(&mut self) {
        if let Some(copying) = self.copying.take() {
            copying.abandon();
        }
    }
}

impl Committer {
    /// Between two groups: switches to a finished copy, or starts one when sled's files have
    /// grown since the last by `Limits::sled_copy_growth_percent` and
    /// `Limits::sled_copy_min_growth_bytes`. A copy that failed or did not start is logged
    /// and dropped (the next copy or open removes its files); a switch that failed stops the
    /// store, as a failed write does.
    pub(super) fn tend_generations(&mut self) -> Result<()> {
        let generations = &mut self.generations;
        if let Some(copying) = &generations.copying {
            let built = match copying.done.try_recv() {
                Err(TryRecvError::Empty) => return Ok(()),
                Ok(built) => built,
                Err(TryRecvError::Disconnected) => Err(Error::Io {
                    path: self.shared.path.clone(),
                    message: "the copier stopped without a word".into(),
                }),
            };
            generations.copying = None;
            return match built {
                Ok(built) => self.switch_generation(built),
                Err(error) => {
                    tracing::warn!(%error, "sled was not copied into a new generation");
                    Ok(())
                }
            };
        }
        let check_every = Duration::from_millis(self.shared.limits.sled_copy_check_ms);
        if generations.checked.elapsed() < check_every {
            return Ok(());
        }
        generations.checked = Instant::now();
        let (number, _) = self.shared.generation_of_sled();
        let bytes = generation::sled_bytes(&self.shared.path, number);
        let base = generations.base_bytes;
        let limits = &self.shared.limits;
        let grown = bytes.saturating_sub(base);
        if grown >= limits.sled_copy_min_growth_bytes
            && u128::from(grown) * 100
                >= u128::from(base) * u128::from(limits.sled_copy_growth_percent)
        {
            tracing::info!(bytes, base, "copying sled into a new generation");
            let cache_bytes = self.shared.limits.cache_bytes;
            match generation::start(
                &self.shared.path,
                self.shared.db()?,
                number + 1,
                cache_bytes,
            ) {
                Ok(copying) => generations.copying = Some(copying),
                Err(error) => tracing::warn!(%error, "sled's copy did not start"),
            }
        }
        Ok(())
    }

    /// Makes the copy durable and complete with what it has not applied yet and the newest
    /// journal seq it holds, makes it the store's sled, and removes the old generation.
    fn switch_generation(&mut self, built: Built) -> Result<()> {
        let started = Instant::now();
        let (seq, _) = self.flushing.applied_now();
        let key = keys::meta(keys::META_JOURNAL_SEQ);
        let last = vec![(
            sled::IVec::from(key),
            Some(sled::IVec::from(codec::encode(&seq))),
        )];
        let data_file = generation::complete(&self.shared.path, &built, last)?;
        let (old, _) = self.shared.generation_of_sled();
        let number = built.number;
        self.flushing
            .switch(&self.shared, (built.db, number), data_file, seq);
        generation::remove(&self.shared.path, old)?;
        let bytes = generation::sled_bytes(&self.shared.path, number);
        self.generations.base_bytes = bytes;
        self.shared
            .metrics
            .sled_generations
            .fetch_add(1, Ordering::Relaxed);
        let paused_ms = started.elapsed().as_millis() as u64;
        tracing::info!(
            generation = number,
            bytes,
            paused_ms,
            "sled switched to a new generation"
        );
        Ok(())
    }
}
