//! C-3, pure: which summaries stand in for which executions on a transcript (`fold`), and a
//! summary as a message. Compacting and naming are `conversation_follow_up.rs`.
//!
//! A compaction replaces a prefix of one path of the conversation graph: the executions from
//! the root to the one it goes `through`. It shows wherever that execution is on the list
//! read (a branch's path, or the whole session), in place of the first execution it
//! replaces; a later compaction through a later execution of the same path shows instead of
//! it. Nothing of the executions changes — their events, the graph, Activity — and the
//! originals are read with `originals` until retention purges them.

use std::collections::HashMap;

use openprogram_storage::conversation::Compaction;
use openprogram_storage::{ExecutionId, MessageId};

use crate::transcript::Message;

/// One entry of a transcript: an execution's messages, or a summary in place of several.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Item<'a> {
    Execution(ExecutionId),
    Summary(&'a Compaction),
}

impl Item<'_> {
    /// The page cursor after this entry (`after`): a summary's is the execution it goes
    /// through.
    pub fn cursor(&self) -> ExecutionId {
        match self {
            Item::Execution(execution_id) => *execution_id,
            Item::Summary(compaction) => compaction.through,
        }
    }

    /// Whether `execution_id` is this entry, or one a summary replaces.
    pub fn holds(&self, execution_id: ExecutionId) -> bool {
        match self {
            Item::Execution(id) => *id == execution_id,
            Item::Summary(compaction) => compaction.replaces.contains(&execution_id),
        }
    }
}

/// `list` (executions, oldest first) as a transcript shows it: each compaction that goes
/// through an execution on the list, unless a later one of the same path covers it, in place
/// of the executions it replaces.
///
/// `anchors`: executions whose parent message belongs to an execution retention purged,
/// with that parent. A compaction whose turn was purged still stands for its prefix: it
/// shows before the first execution of the list that answered the prefix's last message.
pub fn fold<'a>(
    list: &[ExecutionId],
    compactions: &'a [Compaction],
    anchors: &HashMap<ExecutionId, MessageId>,
) -> Vec<Item<'a>> {
    let on_list: std::collections::HashSet<ExecutionId> = list.iter().copied().collect();
    let answered: std::collections::HashSet<MessageId> = list
        .iter()
        .filter_map(|execution_id| anchors.get(execution_id))
        .copied()
        .collect();
    let anchored = |compaction: &Compaction| {
        !on_list.contains(&compaction.through)
            && compaction
                .messages
                .last()
                .is_some_and(|last| answered.contains(last))
    };
    let applicable: Vec<&Compaction> = compactions
        .iter()
        .filter(|compaction| on_list.contains(&compaction.through) || anchored(compaction))
        .collect();
    let shown: Vec<&Compaction> = applicable
        .iter()
        .copied()
        .filter(|compaction| {
            !applicable.iter().any(|other| {
                other.through != compaction.through && other.replaces.contains(&compaction.through)
            })
        })
        .collect();
    let mut covered: HashMap<ExecutionId, usize> = HashMap::new();
    for (at, compaction) in shown.iter().enumerate() {
        for execution_id in &compaction.replaces {
            covered.entry(*execution_id).or_insert(at);
        }
    }
    let mut emitted = vec![false; shown.len()];
    let mut items = Vec::with_capacity(list.len());
    // Each summary shows once, where the first execution it stands for would.
    let mut summary = |at: usize, items: &mut Vec<Item<'a>>| {
        if !std::mem::replace(&mut emitted[at], true) {
            items.push(Item::Summary(shown[at]));
        }
    };
    for execution_id in list {
        if let Some(parent) = anchors.get(execution_id) {
            let stands_for = shown
                .iter()
                .position(|compaction| compaction.messages.last() == Some(parent));
            if let Some(at) = stands_for {
                summary(at, &mut items);
            }
        }
        match covered.get(execution_id) {
            Some(&at) => summary(at, &mut items),
            None => items.push(Item::Execution(*execution_id)),
        }
    }
    items
}

/// A compaction as a message of the transcript.
pub fn summary_message(compaction: &Compaction) -> Message {
    Message {
        message_id: compaction.message_id,
        parent_id: None,
        role: "summary",
        execution_id: compaction.through,
        at_ms: compaction.at_ms,
        text: compaction.summary.clone(),
        state: None,
        blocks: Vec::new(),
        more_after_seq: None,
        forked_from: None,
        replaces: compaction.messages.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compaction(replaces: &[ExecutionId]) -> Compaction {
        Compaction {
            message_id: MessageId::new(),
            through: *replaces.last().expect("one"),
            replaces: replaces.to_vec(),
            messages: Vec::new(),
            summary: "s".into(),
            at_ms: 0,
        }
    }

    #[test]
    fn c3_a_compaction_shows_in_place_of_its_prefix_and_a_later_one_instead_of_it() {
        let ids: Vec<ExecutionId> = (0..5).map(|_| ExecutionId::new()).collect();
        let first = compaction(&ids[..2]);
        let later = compaction(&ids[..4]);
        let both = [first.clone(), later.clone()];
        assert_eq!(
            fold(&ids, &both[..1], &HashMap::new()),
            vec![
                Item::Summary(&both[0]),
                Item::Execution(ids[2]),
                Item::Execution(ids[3]),
                Item::Execution(ids[4]),
            ]
        );
        assert_eq!(
            fold(&ids, &both, &HashMap::new()),
            vec![Item::Summary(&both[1]), Item::Execution(ids[4])]
        );
        // A list without the execution it goes through (another branch) shows the originals.
        let other_branch = [ids[0], ExecutionId::new()];
        assert_eq!(
            fold(&other_branch, &both, &HashMap::new()),
            vec![
                Item::Execution(other_branch[0]),
                Item::Execution(other_branch[1])
            ]
        );
        // Two branches compacted apart, neither through the other's turn, listed together:
        // each summary once, where its first execution was.
        let fork = [ids[0], ExecutionId::new()];
        let apart = [compaction(&ids[..3]), compaction(&fork)];
        let listed = [ids[0], ids[1], ids[2], fork[1], ids[3]];
        // t0 and t1 purged by retention: the summary through t1 still stands first, before
        // the turn whose parent was t1's reply.
        let through_one = Compaction {
            messages: vec![MessageId::new(), MessageId::new()],
            ..compaction(&ids[..2])
        };
        // (An anchor on an earlier message of the prefix is another path: not this summary.)
        let elsewhere = HashMap::from([(ids[2], through_one.messages[0])]);
        assert_eq!(
            fold(&ids[2..], std::slice::from_ref(&through_one), &elsewhere).len(),
            3
        );
        let anchors = HashMap::from([(ids[2], through_one.messages[1])]);
        let kept = [through_one];
        assert_eq!(
            fold(&ids[2..], &kept, &anchors),
            vec![
                Item::Summary(&kept[0]),
                Item::Execution(ids[2]),
                Item::Execution(ids[3]),
                Item::Execution(ids[4])
            ]
        );
        assert_eq!(fold(&ids[2..], &kept, &HashMap::new()).len(), 3);
        assert_eq!(
            fold(&listed, &apart, &HashMap::new()),
            vec![
                Item::Summary(&apart[0]),
                Item::Summary(&apart[1]),
                Item::Execution(ids[3])
            ]
        );
    }
}
