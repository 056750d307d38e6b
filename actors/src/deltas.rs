//! E-3: a model's streamed output as it arrives — pieces of text and reasoning published to
//! whoever watches the execution (the HTTP event stream, `Runtime::deltas`), never stored.
//!
//! Only a whole response is a decision, recorded in the log; a delta is a preview of
//! it. A response cut off (a dropped stream, a crash) leaves its deltas behind as nothing: the
//! request is made again and its deltas start again at `offset` 0, which tells a watcher to
//! drop what it showed. Deltas live on the node that runs the call; a watcher that misses
//! some (it lagged, it reconnected) gets the whole text with the decision's event.
//!
//! Cost when nobody watches: an atomic load per piece, no allocation.

use std::sync::{Arc, Mutex};

use openprogram_storage::{EffectId, ExecutionId};
use serde::Serialize;

use crate::watchers::{Hub, Watch};

/// What a piece is part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeltaKind {
    Text,
    Reasoning,
}

/// One piece of a model call's response, as it arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Delta {
    /// The model call: its decision's `effect_id`, once recorded.
    pub effect_id: EffectId,
    pub kind: DeltaKind,
    /// Where `text` starts in this kind's output of the current try, in bytes: 0 again
    /// when the request is made again (drop what was shown).
    pub offset: u64,
    pub text: String,
}

/// The executions whose deltas are watched (`watchers.rs`).
pub type DeltaHub = Hub<Delta>;

/// A watcher of one execution's deltas. `recv` fails with `Lagged(n)` if it fell `n` pieces
/// behind: the decision's event holds the whole response.
pub type DeltaWatch = Watch<Delta>;

/// Where a provider publishes the pieces of one model call (`ModelRequest::deltas`). A
/// default sink publishes nowhere.
#[derive(Clone, Default)]
pub struct DeltaSink {
    target: Option<(Arc<DeltaHub>, ExecutionId, EffectId)>,
    /// Bytes published so far in this try: [text, reasoning].
    offsets: Arc<Mutex<[u64; 2]>>,
}

impl std::fmt::Debug for DeltaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaSink")
            .field("watched", &self.target.is_some())
            .finish()
    }
}

impl DeltaSink {
    /// A sink for the model call `effect_id` of `execution_id`.
    pub fn new(hub: Arc<DeltaHub>, execution_id: ExecutionId, effect_id: EffectId) -> Self {
        Self {
            target: Some((hub, execution_id, effect_id)),
            offsets: Arc::default(),
        }
    }

    /// A piece of the response's text.
    pub fn text(&self, piece: &str) {
        self.publish(DeltaKind::Text, piece);
    }

    /// A piece of the model's reasoning (thinking), where the API streams it.
    pub fn reasoning(&self, piece: &str) {
        self.publish(DeltaKind::Reasoning, piece);
    }

    /// The request is made again: what follows starts at offset 0.
    pub fn restart(&self) {
        if let Ok(mut offsets) = self.offsets.lock() {
            *offsets = [0, 0];
        }
    }

    fn publish(&self, kind: DeltaKind, piece: &str) {
        let Some((hub, execution_id, effect_id)) = &self.target else {
            return;
        };
        if piece.is_empty() {
            return;
        }
        let offset = match self.offsets.lock() {
            Ok(mut offsets) => {
                let slot = &mut offsets[kind as usize];
                let offset = *slot;
                *slot += piece.len() as u64;
                offset
            }
            Err(_) => return,
        };
        hub.publish(*execution_id, || {
            Arc::new(Delta {
                effect_id: *effect_id,
                kind,
                offset,
                text: piece.to_owned(),
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e3_pieces_reach_watchers_with_their_offsets_and_a_restart_starts_again() {
        let hub = Arc::new(DeltaHub::default());
        let execution = ExecutionId::new();
        let effect = EffectId::new();
        let sink = DeltaSink::new(hub.clone(), execution, effect);
        sink.text("before anyone watches");
        let mut watcher = hub.subscribe(execution);
        sink.text("Hel");
        sink.reasoning("think");
        sink.text("lo");
        sink.restart();
        sink.text("Hello");
        let got: Vec<(DeltaKind, u64, String)> = std::iter::from_fn(|| watcher.try_recv().ok())
            .map(|delta| (delta.kind, delta.offset, delta.text.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (DeltaKind::Text, 21, "Hel".into()),
                (DeltaKind::Reasoning, 0, "think".into()),
                (DeltaKind::Text, 24, "lo".into()),
                (DeltaKind::Text, 0, "Hello".into()),
            ]
        );
        let second = hub.subscribe(execution);
        drop(watcher);
        assert_eq!(hub.watched(), 1, "a watcher is left");
        drop(second);
        assert_eq!(
            hub.watched(),
            0,
            "the last watcher took its channel with it"
        );
        sink.text("nobody watches");
        assert_eq!(hub.watched(), 0);
    }
}
