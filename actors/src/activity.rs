//! The Activity projection (B-1..B-5), pure: from what is recorded about a session's executions
//! to rows per conversation branch, in three sections.
//!
//! The conversation graph has a node per message: each execution's user message (whose parent
//! is the admission's `parent_message_id`) and its reply (whose parent is the user message; a
//! fork or retry adds another reply to the same user message). A branch is a path from a root
//! to a leaf: Activity counts leaves, never executions. A parent that was never recorded stays
//! a node of its own with no parent: missing records never guess a branch (B-1).
//!
//! A branch's id is stable as it grows and forks: from its leaf, go up while the node is its
//! parent's oldest child; the node where that stops (or the root) names the branch.
//!
//! Fork and Retry children are independent executions on branches of their own. "Child tasks"
//! (the functions an agent's calls start, F-6) are no branch of their own (B-2): they are
//! listed under their caller's branch (`child_tasks`, details with `child_of`), keep it In
//! progress while they run, and are what Cancel on an incomplete-response row may still reach
//! (B-4). A child task whose caller is not recorded in the session stays a branch of its own.

use std::collections::{BTreeSet, HashMap};

use openprogram_storage::{ExecutionId, ExecutionState, MessageId};
use serde::Serialize;

/// What the projection needs to know about one execution.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionFacts {
    pub execution_id: ExecutionId,
    pub parent_execution_id: Option<ExecutionId>,
    /// Started by its parent as a child task (not a fork or retry, which are independent).
    pub child_task: bool,
    pub user_message_id: MessageId,
    pub reply_message_id: MessageId,
    pub parent_message_id: Option<MessageId>,
    /// The user's request: shown in the execution's own row only (B-5).
    pub request: String,
    pub state: ExecutionState,
    pub capabilities: Vec<&'static str>,
    /// An approval or question waits for a person (a real wait).
    pub pending_wait: bool,
    /// Its newest wait was declined.
    pub declined_wait: bool,
    pub running_processes: usize,
    /// B-4: its owner ended and only the model's response record is missing (nothing
    /// else is pending).
    pub response_record_incomplete: bool,
    /// Controls accepted and not decided yet, by kind (`cancel`, `continue`, ...).
    pub pending_controls: Vec<&'static str>,
}

/// One execution in a branch's details.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecutionRow {
    pub execution_id: ExecutionId,
    pub request: String,
    pub state: &'static str,
    pub label: String,
    /// B-2: the execution on the branch whose call started this child task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub child_of: Option<ExecutionId>,
}

/// One conversation branch (the `activity` rows of SPEC §6, with its details).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BranchRow {
    pub branch_id: MessageId,
    /// Short, and never the request (B-5).
    pub heading: String,
    /// How many executions the branch holds (its child tasks not among them).
    pub executions: usize,
    /// B-2: how many child tasks its executions started (in `details`, with `child_of`).
    pub child_tasks: usize,
    /// The newest execution's state; `ended` for an incomplete response record, which never
    /// claims `completed` (B-4).
    pub status: &'static str,
    pub label: String,
    /// The controls the row offers (the newest execution's, except B-4: Cancel only while a
    /// child task is active).
    pub controls: Vec<&'static str>,
    /// Oldest first, each execution's child tasks after it.
    pub details: Vec<ExecutionRow>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Activity {
    pub needs_attention: Vec<BranchRow>,
    pub in_progress: Vec<BranchRow>,
    pub history: Vec<BranchRow>,
}

/// An execution's place on the conversation graph (B-1): its messages and the parent of its
/// user message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageLinks {
    pub user_message_id: MessageId,
    pub reply_message_id: MessageId,
    pub parent_message_id: Option<MessageId>,
}

/// C-1: the executions (indexes into `executions`, admission order) on the branch named
/// `branch_id` (the id Activity gives it), oldest first; `None` if no branch has that id.
pub fn branch_executions(executions: &[MessageLinks], branch_id: MessageId) -> Option<Vec<usize>> {
    let graph = Graph::of_links(executions.iter().copied());
    graph
        .leaves()
        .into_iter()
        .find(|leaf| graph.branch_id(*leaf) == branch_id)
        .map(|leaf| graph.executions_to(leaf))
}

/// C-3: the executions (indexes into `executions`) whose replies lie on the path from the
/// root to `message`, oldest first.
pub fn executions_to(executions: &[MessageLinks], message: MessageId) -> Vec<usize> {
    Graph::of_links(executions.iter().copied()).executions_to(message)
}

/// B-1..B-5: `executions` in admission order.
pub fn project(all: &[ExecutionFacts]) -> Activity {
    // B-2: a child task is on its caller's branch, not on one of its own.
    let ids: std::collections::HashSet<ExecutionId> =
        all.iter().map(|facts| facts.execution_id).collect();
    let recorded = |id: ExecutionId| ids.contains(&id);
    let caller = |facts: &ExecutionFacts| facts.parent_execution_id.filter(|_| facts.child_task);
    let child_of = |facts: &ExecutionFacts| caller(facts).filter(|id| recorded(*id));
    let executions: Vec<&ExecutionFacts> = all
        .iter()
        .filter(|facts| child_of(facts).is_none())
        .collect();
    let graph = Graph::of(&executions);
    let leaves = graph.leaves();
    // Headings number branches in the order their naming nodes were first recorded, so a
    // branch keeps its number as others grow.
    let mut branch_ids: Vec<MessageId> = leaves.iter().map(|leaf| graph.branch_id(*leaf)).collect();
    branch_ids.sort_by_key(|id| graph.order.iter().position(|seen| seen == id));
    let mut activity = Activity::default();
    for leaf in leaves {
        let path = graph.executions_to(leaf);
        let Some(&newest) = path.last() else {
            continue;
        };
        let on_branch: Vec<&ExecutionFacts> = path.iter().map(|&at| executions[at]).collect();
        let on = |id: ExecutionId| on_branch.iter().any(|member| member.execution_id == id);
        let children: Vec<&ExecutionFacts> = all
            .iter()
            .filter(|child| child_of(child).is_some_and(on))
            .collect();
        let (section, status, label, controls) =
            classify(&on_branch, executions[newest], &children);
        let branch_id = graph.branch_id(leaf);
        let number = branch_ids
            .iter()
            .position(|id| *id == branch_id)
            .unwrap_or(0)
            + 1;
        let row = BranchRow {
            branch_id,
            heading: format!("Branch {number}"),
            executions: on_branch.len(),
            child_tasks: children.len(),
            status,
            label: label.to_owned(),
            controls,
            details: details(&on_branch, &children),
        };
        match section {
            Section::Attention => activity.needs_attention.push(row),
            Section::Progress => activity.in_progress.push(row),
            Section::History => activity.history.push(row),
        }
    }
    activity
}

/// Where a branch's row goes and what it says (B-2..B-4): its section, status, label and
/// controls, from its executions (oldest first, `newest` last) and their child tasks: a
/// child task that waits for a person, is paused or has an unknown effect needs one as much
/// as the branch's own executions do, and one that runs keeps the branch in progress.
fn classify(
    on_branch: &[&ExecutionFacts],
    newest: &ExecutionFacts,
    children: &[&ExecutionFacts],
) -> (Section, &'static str, &'static str, Vec<&'static str>) {
    let state = newest.state;
    let active_children = children.iter().any(|child| runs(child.state));
    let everyone = || on_branch.iter().chain(children);
    let waiting = everyone().any(|member| member.pending_wait);
    // An unknown effect anywhere on the branch needs a person, however new the rest.
    let unresolved =
        everyone().any(|member| member.state == ExecutionState::ReconciliationRequired);
    let child_needs = children.iter().find(|child| needs_attention(child.state));
    let processes = on_branch.iter().any(|member| member.running_processes > 0);
    // An old Cancel does not make it actionable; any other pending control does.
    let incomplete = newest.response_record_incomplete
        && newest.pending_controls.iter().all(|kind| *kind == "cancel")
        && !waiting
        && !unresolved
        && !processes;
    if incomplete {
        let controls = active_children.then_some("cancel").into_iter().collect();
        let label = "Ended · response record incomplete";
        return (Section::History, "ended", label, controls);
    }
    let (section, label) = if waiting {
        (Section::Attention, "Waiting for your response")
    } else if unresolved && !needs_attention(state) {
        (Section::Attention, "Unresolved tool result")
    } else if needs_attention(state) {
        (Section::Attention, state_label(state))
    } else if let Some(child) = child_needs {
        (Section::Attention, child_label(child.state))
    } else if runs(state) || active_children {
        (Section::Progress, state_label(state))
    } else if processes {
        (Section::Progress, "Process running")
    } else {
        (Section::History, state_label(state))
    };
    (section, state.as_str(), label, newest.capabilities.clone())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    Attention,
    Progress,
    History,
}

/// A pause, an unresolved tool result or an expired continuation needs a person (B-3).
fn needs_attention(state: ExecutionState) -> bool {
    matches!(
        state,
        ExecutionState::Paused
            | ExecutionState::Waiting
            | ExecutionState::ReconciliationRequired
            | ExecutionState::Expired
    )
}

fn runs(state: ExecutionState) -> bool {
    matches!(
        state,
        ExecutionState::Queued | ExecutionState::Running | ExecutionState::Cancelling
    )
}

/// A row's label when a child task needs a person (B-2, B-3).
fn child_label(state: ExecutionState) -> &'static str {
    match state {
        ExecutionState::Paused => "Child task paused",
        ExecutionState::Expired => "Child task expired · Continue to resume",
        _ => state_label(state),
    }
}

fn state_label(state: ExecutionState) -> &'static str {
    match state {
        ExecutionState::Queued => "Queued",
        ExecutionState::Running => "Running",
        ExecutionState::Paused => "Paused",
        ExecutionState::Waiting => "Waiting for your response",
        ExecutionState::Cancelling => "Cancelling",
        ExecutionState::Cancelled => "Cancelled",
        ExecutionState::Completed => "Completed",
        ExecutionState::Failed => "Failed",
        ExecutionState::ReconciliationRequired => "Unresolved tool result",
        ExecutionState::Expired => "Expired · Continue to resume",
    }
}

/// A branch's details: its executions, oldest first, each followed by its child tasks.
fn details(on_branch: &[&ExecutionFacts], children: &[&ExecutionFacts]) -> Vec<ExecutionRow> {
    let mut rows = Vec::new();
    for member in on_branch {
        rows.push(execution_row(member));
        let called =
            |child: &&&ExecutionFacts| child.parent_execution_id == Some(member.execution_id);
        for child in children.iter().filter(called) {
            rows.push(ExecutionRow {
                child_of: Some(member.execution_id),
                ..execution_row(child)
            });
        }
    }
    rows
}

fn execution_row(facts: &ExecutionFacts) -> ExecutionRow {
    let label = if facts.pending_wait {
        "Waiting for your response"
    } else if facts.declined_wait {
        "Declined"
    } else if facts.response_record_incomplete {
        "Ended · response record incomplete"
    } else {
        state_label(facts.state)
    };
    ExecutionRow {
        execution_id: facts.execution_id,
        request: facts.request.clone(),
        state: facts.state.as_str(),
        label: label.to_owned(),
        child_of: None,
    }
}

/// The message graph of a session.
#[derive(Default)]
struct Graph {
    /// Each message's parent, if recorded.
    parent: HashMap<MessageId, MessageId>,
    /// Each message's children, oldest first.
    children: HashMap<MessageId, Vec<MessageId>>,
    /// Every message, in the order first seen.
    order: Vec<MessageId>,
    /// The execution (index) whose reply a message is.
    reply_of: HashMap<MessageId, usize>,
}

impl Graph {
    fn of(executions: &[&ExecutionFacts]) -> Self {
        Self::of_links(executions.iter().map(|facts| MessageLinks {
            user_message_id: facts.user_message_id,
            reply_message_id: facts.reply_message_id,
            parent_message_id: facts.parent_message_id,
        }))
    }

    fn of_links(executions: impl Iterator<Item = MessageLinks>) -> Self {
        let mut graph = Graph::default();
        for (index, links) in executions.enumerate() {
            if let Some(parent) = links.parent_message_id {
                graph.link(parent, links.user_message_id);
            } else {
                graph.node(links.user_message_id);
            }
            graph.link(links.user_message_id, links.reply_message_id);
            graph.reply_of.insert(links.reply_message_id, index);
        }
        graph
    }

    fn node(&mut self, message: MessageId) {
        if let std::collections::hash_map::Entry::Vacant(entry) = self.children.entry(message) {
            entry.insert(Vec::new());
            self.order.push(message);
        }
    }

    fn link(&mut self, parent: MessageId, child: MessageId) {
        self.node(parent);
        self.node(child);
        if self.parent.insert(child, parent).is_none() {
            if let Some(children) = self.children.get_mut(&parent) {
                children.push(child);
            }
        }
    }

    /// Messages without children, in the order first seen: one branch each.
    fn leaves(&self) -> Vec<MessageId> {
        self.order
            .iter()
            .copied()
            .filter(|message| self.children.get(message).is_none_or(Vec::is_empty))
            .collect()
    }

    /// The executions whose replies lie on the path from the root to `leaf`, oldest first.
    fn executions_to(&self, leaf: MessageId) -> Vec<usize> {
        let mut path = Vec::new();
        let mut at = Some(leaf);
        let mut seen = BTreeSet::new();
        while let Some(message) = at {
            if !seen.insert(message) {
                break; // a cycle can only come from corrupt records: stop, never loop
            }
            if let Some(&execution) = self.reply_of.get(&message) {
                path.push(execution);
            }
            at = self.parent.get(&message).copied();
        }
        path.reverse();
        path
    }

    fn branch_id(&self, leaf: MessageId) -> MessageId {
        let mut at = leaf;
        let mut steps = 0;
        while let Some(parent) = self.parent.get(&at) {
            let oldest = self
                .children
                .get(parent)
                .and_then(|children| children.first());
            if oldest != Some(&at) || steps > self.order.len() {
                return at;
            }
            at = *parent;
            steps += 1;
        }
        at
    }
}
