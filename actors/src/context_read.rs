//! E-8: reading a turn's branch — the earlier turns its model requests carry — from the
//! store, once per activation, and the cache that makes that one execution's read.
//!
//! A branch is the path of the conversation graph from the root to the turn's parent
//! message (B-1), each turn on it folded from its events, with the newest compaction that
//! covers it (C-3) in place of the turns it replaced. The turn fixes what could still change
//! — which summary stands, which earlier turns had not ended and through which seq — in its
//! `ContextPin` before its first model request, so a restart reads the same branch again.
//!
//! Costs: a turn whose parent's branch is in the cache (the parent ended on this node, or a
//! sibling read it) reads nothing but the conversation record; the turn adds itself when it
//! ends. A miss (a restart, another node's turn) reads the session's graph (a head and an
//! admission event per execution) and replays each turn on the path: once, then cached.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use openprogram_storage::conversation::Compaction;
use openprogram_storage::{Event, EventStore, ExecutionId, MessageId, SessionId};

use crate::activity::executions_to;
use crate::compaction::{fold, Item};
use crate::context::{estimate_tokens, over_budget, Branch, Earlier, EarlierTurn, OverBudget};
use crate::conversation_read::{links_of, record_of};
use crate::error::Result;
use crate::machine::{ContextPin, Machine};

/// Branches the cache keeps, at most.
const CACHED_BRANCHES_MAX: usize = 1024;
/// Text the cached branches hold, at most, counting a turn shared by several once per
/// branch (so it overcounts).
const CACHED_BYTES_MAX: usize = 256 << 20;

/// A turn's branch, as read for its model requests.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// What its requests carry before the turn's own progress.
    pub earlier: Branch,
    /// Entries left out for the context budget, oldest first.
    pub left_out: u32,
    /// What reads this branch again exactly.
    pub pin: ContextPin,
    /// Every earlier turn, no summary, if all of them had ended: what the turn's own end
    /// extends for the next turn (`BranchCache`).
    pub whole: Option<Branch>,
}

/// Reads the branch of a turn whose user message answers `parent` (none: a root turn, no
/// earlier turns), as `pinned` fixed it if the turn fixed it already.
pub fn load(
    store: &dyn EventStore,
    cache: &BranchCache,
    session_id: SessionId,
    parent: Option<MessageId>,
    pinned: Option<&ContextPin>,
) -> Result<Loaded> {
    let Some(parent) = parent else {
        return Ok(Loaded {
            whole: Some(Branch::default()),
            ..Loaded::default()
        });
    };
    let open_pinned = pinned.map_or(&[][..], |pin| &pin.open[..]);
    let cached = cache.get(parent).filter(|_| open_pinned.is_empty());
    let (whole, open) = match cached {
        Some(whole) => (whole, Vec::new()),
        None => read_whole(store, session_id, parent, pinned.is_some(), open_pinned)?,
    };
    let (earlier, summaries, first_kept) = match pinned {
        Some(pin) => (from_pin(&whole, pin), pin.summaries.clone(), pin.first_kept),
        None => with_summary(&whole, &record_of(store, session_id)?.compactions),
    };
    if open.is_empty() {
        cache.put(parent, whole.clone());
    }
    let mut loaded = Loaded {
        earlier,
        left_out: 0,
        pin: ContextPin {
            summaries,
            first_kept,
            open: open.clone(),
            left_out: 0,
        },
        whole: open.is_empty().then_some(whole),
    };
    loaded.cut(pinned.map_or(0, |pin| pin.left_out as usize));
    Ok(loaded)
}

impl Loaded {
    /// Leaves out the `entries` oldest entries of what the requests carry.
    fn cut(&mut self, entries: usize) {
        let entries = entries.min(self.earlier.len());
        if entries == 0 {
            return;
        }
        self.earlier = self.earlier.without_oldest(entries);
        let entries = u32::try_from(entries).unwrap_or(u32::MAX);
        self.left_out = self.left_out.saturating_add(entries);
        self.pin.left_out = self.left_out;
    }
}

/// What a turn's next model request needs first.
#[derive(Debug, Clone, PartialEq)]
pub enum Prepared {
    /// Nothing: make it.
    Ready,
    /// Fix its branch first (`ContextPinned`); the commit asks for the request again.
    Pin(Event),
    /// Over its budget: the compactor summarizes the branch through this turn first
    /// (`TurnContext::compacted` after).
    Compact(ExecutionId),
}

/// E-8: a turn's branch across its model requests in one activation: read at the first,
/// then kept within the context budget before each.
#[derive(Debug, Default)]
pub struct TurnContext {
    loaded: Option<Loaded>,
    /// A compaction for the budget was asked for in this activation (made or failed): not
    /// again, the oldest entries are left out instead.
    compacted: bool,
    /// Read the branch next with this pin (the summary a budget compaction just made).
    reread_with: Option<ContextPin>,
}

/// What `TurnContext::prepare` needs of the runtime.
#[derive(Clone, Copy)]
#[allow(missing_debug_implementations)] // a store is no `Debug`
pub struct Reading<'a> {
    pub store: &'a dyn EventStore,
    pub cache: &'a BranchCache,
    /// The context budget in tokens, if there is one.
    pub budget: Option<u64>,
    /// With a compactor: all but the newest this many earlier turns may be summarized.
    pub compact_keep: Option<usize>,
}

impl TurnContext {
    /// What the turn of `machine` (in `session_id`) needs before its next model request.
    pub fn prepare(
        &mut self,
        reading: Reading<'_>,
        session_id: SessionId,
        machine: &Machine,
    ) -> Result<Prepared> {
        let loaded = match self.loaded.take() {
            Some(loaded) => loaded,
            None => {
                let pinned = self.reread_with.take();
                load(
                    reading.store,
                    reading.cache,
                    session_id,
                    machine.present.turn.parent_message_id,
                    pinned
                        .as_ref()
                        .or(machine.present.turn.context_pin.as_ref()),
                )?
            }
        };
        let loaded = self.loaded.insert(loaded);
        if let Some(budget) = reading.budget {
            let estimate = estimate_tokens(
                &loaded.earlier,
                &machine.present.turn.input.message,
                &machine.context,
                machine.present.turn.last_prompt,
            );
            let keep = reading.compact_keep.filter(|_| !self.compacted);
            match over_budget(budget, estimate, &loaded.earlier, keep) {
                Some(OverBudget::Compact { through }) => {
                    self.compacted = true;
                    return Ok(Prepared::Compact(through));
                }
                Some(OverBudget::Cut { entries }) => loaded.cut(entries),
                None => {}
            }
        }
        Ok(machine
            .pin_context(&loaded.pin)
            .map_or(Prepared::Ready, Prepared::Pin))
    }

    /// After the compaction `Prepared::Compact` asked for: `made` stands for the branch
    /// through its turn from the next request on (`None`: it failed; the oldest entries are
    /// left out instead).
    pub fn compacted(&mut self, made: Option<&Compaction>) {
        let (Some(made), Some(loaded)) = (made, self.loaded.take()) else {
            return;
        };
        let whole = loaded.whole.unwrap_or_else(|| loaded.earlier.clone());
        let turns = turns_of(&whole);
        let first_kept = turns
            .iter()
            .position(|turn| turn.execution_id == made.through)
            .and_then(|at| turns.get(at + 1))
            .map(|turn| turn.execution_id);
        self.reread_with = Some(ContextPin {
            summaries: vec![(made.message_id, made.summary.clone())],
            first_kept,
            open: loaded.pin.open,
            left_out: 0,
        });
    }

    /// What the requests carry before the turn's own progress, and how many entries were
    /// left out.
    pub fn earlier(&self) -> (Branch, u32) {
        self.loaded
            .as_ref()
            .map_or((Branch::default(), 0), |loaded| {
                (loaded.earlier.clone(), loaded.left_out)
            })
    }

    /// Every earlier turn, if all of them had ended: what the turn's end extends for the
    /// next turn (`BranchCache`).
    pub fn whole(&self) -> Option<&Branch> {
        self.loaded
            .as_ref()
            .and_then(|loaded| loaded.whole.as_ref())
    }
}

/// Every turn on the path from the root to `parent`, folded from the store, and those of
/// them that had not ended with the seq they count through. `pinned`: the turn fixed its
/// branch, and `open_pinned` are the turns that had not ended then (any other had).
fn read_whole(
    store: &dyn EventStore,
    session_id: SessionId,
    parent: MessageId,
    pinned: bool,
    open_pinned: &[(ExecutionId, u64)],
) -> Result<(Branch, Vec<(ExecutionId, u64)>)> {
    let mut all = Vec::new();
    let mut links = Vec::new();
    for execution_id in store.executions_in_session(session_id)? {
        match links_of(store, execution_id) {
            Ok(found) => {
                all.push(execution_id);
                links.push(found);
            }
            Err(crate::error::Error::NotFound) => {} // purged since it was listed (S-8)
            Err(error) => return Err(error),
        }
    }
    let mut branch = Branch::default();
    let mut open = Vec::new();
    for at in executions_to(&links, parent) {
        let execution_id = all[at];
        let Some(head) = store.head(execution_id)? else {
            continue; // purged meanwhile (S-8)
        };
        let fixed = open_pinned.iter().find(|(id, _)| *id == execution_id);
        let through = fixed.map_or(head.last_seq, |(_, seq)| *seq);
        // A turn not ended when this one fixes its branch counts through the seq read now;
        // once fixed, every other turn on it had ended (and an ended turn never changes).
        if fixed.is_some() || (!pinned && !head.state.is_terminal()) {
            open.push((execution_id, through));
        }
        let machine = crate::rebuild::replay(store, execution_id, through)?;
        if let Some(turn) = earlier_turn(&machine, execution_id, links[at].reply_message_id) {
            branch = branch.then(Earlier::Turn(Arc::new(turn)));
        }
    }
    Ok((branch, open))
}

/// An agent turn as a later turn's request shows it; a durable function's execution shows
/// nothing (its steps are not a conversation).
pub fn earlier_turn(
    machine: &Machine,
    execution_id: ExecutionId,
    reply_message_id: MessageId,
) -> Option<EarlierTurn> {
    if machine.present.function.is_some() {
        return None;
    }
    Some(EarlierTurn {
        execution_id,
        parent_message_id: machine.present.turn.parent_message_id,
        reply_message_id,
        message: machine.present.turn.input.message.clone(),
        turns: machine.context.clone(),
    })
}

/// The turns of a branch read whole (no summary in it), oldest first.
fn turns_of(whole: &Branch) -> Vec<&Arc<EarlierTurn>> {
    whole
        .entries()
        .into_iter()
        .filter_map(Earlier::turn)
        .collect()
}

/// The summaries standing for a branch's oldest turns (message id and text), then its turns
/// from `first` (an index into `turns`) on.
fn summarized(
    summaries: &[(MessageId, String)],
    turns: &[&Arc<EarlierTurn>],
    first: usize,
) -> Branch {
    let branch = summaries
        .iter()
        .fold(Branch::default(), |branch, (message_id, text)| {
            branch.then(Earlier::Summary {
                message_id: *message_id,
                text: text.as_str().into(),
            })
        });
    turns[first.min(turns.len())..]
        .iter()
        .fold(branch, |branch, turn| {
            branch.then(Earlier::Turn(Arc::clone(turn)))
        })
}

/// `whole` with the compactions of `compactions` that cover its oldest turns in their place
/// (C-3's `fold`, on this one path); those summaries, and the oldest turn after them.
fn with_summary(
    whole: &Branch,
    compactions: &[Compaction],
) -> (Branch, Vec<(MessageId, String)>, Option<ExecutionId>) {
    if compactions.is_empty() {
        return (whole.clone(), Vec::new(), None);
    }
    let turns = turns_of(whole);
    let ids: Vec<ExecutionId> = turns.iter().map(|turn| turn.execution_id).collect();
    // The oldest turn read answers a message of a turn retention purged: a summary of the
    // purged prefix still stands before it.
    let anchors: HashMap<ExecutionId, MessageId> = turns
        .first()
        .and_then(|first| Some((first.execution_id, first.parent_message_id?)))
        .into_iter()
        .collect();
    let items = fold(&ids, compactions, &anchors);
    let summaries: Vec<(MessageId, String)> = items
        .iter()
        .filter_map(|item| match item {
            Item::Summary(compaction) => Some((compaction.message_id, compaction.summary.clone())),
            Item::Execution(_) => None,
        })
        .collect();
    if summaries.is_empty() {
        return (whole.clone(), Vec::new(), None);
    }
    // On one path the summaries stand first: the turns they leave are the rest.
    let first_kept = items.iter().find_map(|item| match item {
        Item::Execution(execution_id) => Some(*execution_id),
        Item::Summary(_) => None,
    });
    let first = first_kept.map_or(turns.len(), |kept| {
        ids.iter().position(|id| *id == kept).unwrap_or(turns.len())
    });
    (summarized(&summaries, &turns, first), summaries, first_kept)
}

/// `whole` as `pin` fixed it: the summaries it holds, then the turns from its first kept
/// one on (all of them if retention purged that one since).
fn from_pin(whole: &Branch, pin: &ContextPin) -> Branch {
    if pin.summaries.is_empty() {
        return whole.clone();
    }
    let turns = turns_of(whole);
    let first = match pin.first_kept {
        None => turns.len(),
        Some(kept) => turns
            .iter()
            .position(|turn| turn.execution_id == kept)
            .unwrap_or(0),
    };
    summarized(&pin.summaries, &turns, first)
}

/// Branches read lately, by the reply message of their newest turn: the next turn of a
/// conversation finds its parent's branch here and reads nothing more. Every turn on a
/// cached branch had ended, so it never changes; bounded in branches and bytes, oldest out
/// first.
#[derive(Debug, Default)]
pub struct BranchCache {
    inner: Mutex<Cached>,
}

#[derive(Debug, Default)]
struct Cached {
    by_reply: HashMap<MessageId, Branch>,
    order: VecDeque<MessageId>,
    bytes: usize,
}

impl BranchCache {
    pub fn get(&self, reply_message_id: MessageId) -> Option<Branch> {
        let cached = self.inner.lock().ok()?;
        cached.by_reply.get(&reply_message_id).cloned()
    }

    /// Keeps `branch`, whose newest turn's reply is `reply_message_id`.
    pub fn put(&self, reply_message_id: MessageId, branch: Branch) {
        let Ok(mut cached) = self.inner.lock() else {
            return;
        };
        let bytes = branch.bytes();
        if bytes > CACHED_BYTES_MAX {
            return;
        }
        if let Some(replaced) = cached.by_reply.insert(reply_message_id, branch) {
            cached.bytes -= replaced.bytes();
        } else {
            cached.order.push_back(reply_message_id);
        }
        cached.bytes += bytes;
        while cached.order.len() > CACHED_BRANCHES_MAX || cached.bytes > CACHED_BYTES_MAX {
            let Some(oldest) = cached.order.pop_front() else {
                break;
            };
            if let Some(dropped) = cached.by_reply.remove(&oldest) {
                cached.bytes -= dropped.bytes();
            }
        }
    }

    /// How many branches it holds (the debug endpoint and tests).
    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |cached| cached.by_reply.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
