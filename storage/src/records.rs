//! The records the log maintains beside its events: the execution head and the records that
//! are looked up by id (commands, receipts, waits, processes) or by content (blobs).
//!
//! Encoding: like events, these are bincode-encoded by field order. Never reorder or remove a
//! field or variant; a change of shape needs a new format version and a migration.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{
    AttemptId, CommandId, EffectId, ExecutionId, LeaseId, MessageId, OwnerId, ProcessId,
    RevisionId, RunId, SessionId, TurnId, WaitId,
};

/// An enum whose variants have fixed names in the HTTP contract, one table for both ways:
/// `as_str`, and `parse` back. Stored by variant index like the others: never reorder.
macro_rules! named {
    ($(#[$meta:meta])* pub enum $name:ident {
        $($(#[$variant_meta:meta])* $variant:ident => $text:literal,)*
    }) => {
        $(#[$meta])*
        pub enum $name {
            $($(#[$variant_meta])* $variant,)*
        }

        impl $name {
            /// Every variant, in their (stored) order.
            pub const ALL: [Self; [$($text),*].len()] = [$($name::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }

            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

/// E-1: what kind of work an execution is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ExecutionKind {
    AgentTurn,
    Job,
    Function,
}

named! {
    /// The state of an execution (the `state` field of the HTTP contract).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    pub enum ExecutionState {
        Queued => "queued",
        Running => "running",
        Paused => "paused",
        Waiting => "waiting",
        Cancelling => "cancelling",
        Cancelled => "cancelled",
        Completed => "completed",
        Failed => "failed",
        ReconciliationRequired => "reconciliation_required",
        Expired => "expired",
    }
}

impl ExecutionState {
    /// Terminal states never change again and are not kept in the by-state index.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ExecutionState::Cancelled | ExecutionState::Completed | ExecutionState::Failed
        )
    }

    /// The byte that names this state in the by-state index key: its place in `ALL`, from
    /// 1, fixed forever as the order is.
    pub fn code(self) -> u8 {
        self as u8 + 1
    }
}

impl fmt::Display for ExecutionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The attempt that currently owns an execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptLease {
    pub attempt_id: AttemptId,
    pub owner_id: OwnerId,
    pub epoch: u64,
}

/// The next action, published after every provider decision and tool result (E-3).
/// `next_action` is JSON text owned by the execution state machine that names the action;
/// its content (a tool call's arguments, a model's text) stays in the events up to `seq`,
/// because the head is written again with every transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The seq of the event that published it.
    pub seq: u64,
    pub next_action: String,
}

/// Why and until when an interrupted execution may be continued automatically.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartIntent {
    /// `None`: no time limit (restart window `-1`).
    pub deadline_ms: Option<u64>,
    pub recorded_at_ms: u64,
    pub reason: String,
}

/// The current summary of one execution: everything needed to validate the next
/// transition and to classify it at startup without reading its events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionHead {
    pub execution_id: ExecutionId,
    pub session_id: SessionId,
    pub run_id: RunId,
    pub parent_execution_id: Option<ExecutionId>,
    pub kind: ExecutionKind,
    pub revision_id: RevisionId,
    pub turn_id: TurnId,
    pub user_message_id: MessageId,
    pub reply_message_id: MessageId,
    pub state: ExecutionState,
    pub pause_reason: Option<String>,
    /// Number of committed transitions. Set by the committer; the value a caller puts here
    /// is ignored.
    pub version: u64,
    /// Seq of the newest event. Set by the committer.
    pub last_seq: u64,
    /// The highest writer epoch ever accepted. Set by the committer: writes with a lower
    /// epoch are fenced.
    pub fencing_epoch: u64,
    pub attempt: Option<AttemptLease>,
    pub checkpoint: Option<Checkpoint>,
    pub restart_intent: Option<RestartIntent>,
    /// Wall-clock time of the last commit. Set by the committer.
    pub last_activity_ms: u64,
}

impl ExecutionHead {
    /// A head for a new execution, before its first commit.
    pub fn new(
        execution_id: ExecutionId,
        session_id: SessionId,
        run_id: RunId,
        kind: ExecutionKind,
    ) -> Self {
        Self {
            execution_id,
            session_id,
            run_id,
            parent_execution_id: None,
            kind,
            revision_id: RevisionId::new(),
            turn_id: TurnId::new(),
            user_message_id: MessageId::new(),
            reply_message_id: MessageId::new(),
            state: ExecutionState::Queued,
            pause_reason: None,
            version: 0,
            last_seq: 0,
            fencing_epoch: 0,
            attempt: None,
            checkpoint: None,
            restart_intent: None,
            last_activity_ms: 0,
        }
    }
}

/// A control of K-2 as it is recorded once applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    Pause,
    Continue,
    Step,
    Steer {
        text: String,
    },
    Cancel,
    /// resolves the execution's `Unknown` effect as `Confirmed` (with its output) or
    /// `NotApplied` (it may run again). Only reconciliation produces these.
    Reconcile {
        effect_id: EffectId,
        status: ReceiptStatus,
        output: String,
    },
    /// W-2: answers an open wait. For an approval, `scope` says what it grants.
    Answer {
        wait_id: WaitId,
        answer: String,
        scope: AnswerScope,
    },
    /// W-2: declines an open wait; the operation it guards never runs.
    Decline {
        wait_id: WaitId,
    },
    /// P-2: stops a managed process of this execution (its own control, not Cancel's).
    StopProcess {
        process_id: ProcessId,
    },
    /// F-3, K-7: a durable function's version policy from now on. Starts nothing.
    SetPolicy {
        policy: VersionPolicy,
    },
    /// W-7: the grant an approval `grant_id` gave (its tool, for this execution or the
    /// session) approves nothing from now on.
    Revoke {
        grant_id: WaitId,
    },
    /// K-7: the execution's own restart window from now on, and a function's version
    /// policy with it if given (schema 17). Starts nothing.
    SetExecutionPolicy {
        version_policy: Option<VersionPolicy>,
        restart_window: crate::policy::RestartWindow,
    },
}

named! {
    /// F-3: which code a paused or recovered function execution continues on.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum VersionPolicy {
        /// The revision it runs (the one it started with, or one it adopted): never other code.
        #[default]
        KeepOriginal => "keep_original",
        /// The newest registered revision, through the step correspondence it declares.
        UseLatest => "use_latest",
    }
}

named! {
    /// W-2: what an answer grants. Scopes never widen implicitly: there is no "always".
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    pub enum AnswerScope {
        /// Approves (or answers) this one operation only.
        Operation => "operation",
        /// A discussion reply instead of a decision: nothing is approved.
        Discussion => "discussion",
        /// W-7: approves the approval's tool for the rest of this execution.
        Tool => "tool",
        /// W-7: approves the approval's tool for every execution of the session.
        Session => "session",
    }
}

impl Control {
    /// The command kind of the HTTP contract (`"pause"`, `"steer"`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Control::Pause => "pause",
            Control::Continue => "continue",
            Control::Step => "step",
            Control::Steer { .. } => "steer",
            Control::Cancel => "cancel",
            Control::Reconcile { .. } => "reconcile",
            Control::Answer { .. } => "answer",
            Control::Decline { .. } => "decline",
            Control::StopProcess { .. } => "stop_process",
            Control::SetPolicy { .. } | Control::SetExecutionPolicy { .. } => "set_policy",
            Control::Revoke { .. } => "revoke",
        }
    }
}

/// K-1: where a command is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandStatus {
    Accepted,
    Applied,
    Rejected,
}

/// A command saved by the command service, found again by its id (K-4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandRecord {
    pub command_id: CommandId,
    pub execution_id: ExecutionId,
    pub kind: String,
    /// BLAKE3 of the canonical payload: the same id with another payload is rejected.
    pub payload_hash: [u8; 32],
    pub status: CommandStatus,
    pub reason: Option<String>,
    /// The stable code of a rejection (`stale_version`, `not_available`, ...), for
    /// transports; `None` before schema 6, and for commands not rejected.
    pub reason_code: Option<String>,
    /// The execution version the outcome was committed at.
    pub result_version: Option<u64>,
    /// The child of a Fork or Retry.
    pub child_execution_id: Option<ExecutionId>,
    pub accepted_at_ms: u64,
}

/// E-4: what is known about one effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReceiptStatus {
    /// Dispatched, outcome not yet recorded. After a crash it reads as `Unknown`.
    Dispatched,
    Confirmed,
    Failed,
    NotStarted,
    Unknown,
    NotApplied,
}

/// The receipt of one effect (a model request or a tool call).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptRecord {
    pub effect_id: EffectId,
    pub execution_id: ExecutionId,
    pub attempt_id: Option<AttemptId>,
    pub epoch: u64,
    pub tool: String,
    pub status: ReceiptStatus,
    /// The result or error as JSON text.
    pub output: Option<String>,
}

named! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    pub enum WaitKind {
        Approval => "approval",
        Question => "question",
        Form => "form",
        Permission => "permission",
        Live => "live",
    }
}

named! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    pub enum WaitStatus {
        Open => "open",
        Submitted => "submitted",
        Answered => "answered",
        Declined => "declined",
        Expired => "expired",
        Invalidated => "invalidated",
    }
}

impl WaitStatus {
    /// Still waiting for a decision (an accepted answer may still be rejected).
    pub fn is_pending(self) -> bool {
        matches!(self, WaitStatus::Open | WaitStatus::Submitted)
    }
}

/// What a session holds across its executions, changed only by a transition that
/// names the version it read (`SessionWrite`): its approval grants (W-7), and the foreground
/// turn with the turns waiting behind it (C-2).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub session_id: SessionId,
    /// 0 before its first write; set by the committer (one more than the version read).
    pub version: u64,
    pub foreground: Option<ExecutionId>,
    pub waiting: Vec<ExecutionId>,
    pub grants: Vec<SessionGrant>,
}

/// W-7: an approval answered for a tool, for the whole session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionGrant {
    /// The approval (wait) that granted it.
    pub grant_id: WaitId,
    pub tool: String,
    pub granted_by: ExecutionId,
    /// Revoked grants are kept, so a revocation is never undone by a late write.
    pub revoked: bool,
}

/// W-4: what a live question is bound to — the exact attempt and the call that asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveBinding {
    pub attempt_id: AttemptId,
    /// The fencing epoch of that attempt (its generation).
    pub epoch: u64,
    /// The tool call that asked.
    pub effect_id: EffectId,
}

/// A durable wait (W-1) or a live question (W-4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitRecord {
    pub wait_id: WaitId,
    pub execution_id: ExecutionId,
    pub kind: WaitKind,
    pub prompt: String,
    pub status: WaitStatus,
    /// The checkpoint the wait was opened at: recovery honours its outcome only while this
    /// is still the execution's current checkpoint (W-3).
    pub checkpoint_seq: u64,
    pub attempt_id: Option<AttemptId>,
    pub answer: Option<String>,
}

named! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    pub enum ProcessState {
        Running => "running",
        Exited => "exited",
        Stopped => "stopped",
        Lost => "lost",
    }
}

/// A managed process (P-1). The OS pid is a hint, never permission to signal (P-3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    pub process_id: ProcessId,
    pub execution_id: ExecutionId,
    pub attempt_id: AttemptId,
    pub owner_id: OwnerId,
    pub program: String,
    pub args: Vec<String>,
    pub os_pid: Option<u32>,
    /// Start time of the pid from `/proc/<pid>/stat`, to tell a reused pid apart.
    pub os_start_time: Option<u64>,
    pub state: ProcessState,
    pub exit_code: Option<i32>,
    pub output_bytes: u64,
    /// Persisted output chunks, oldest first.
    pub output_chunks: Vec<BlobHash>,
}

/// J-1: what a Job may use while it holds a lease; `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobBudget {
    /// Steps (model decisions, tool results, function steps) taken while leased.
    pub steps: Option<u32>,
    /// Milliseconds of holding a lease (time queued is not charged).
    pub wall_ms: Option<u64>,
}

/// J-1: a lease of resources, held by one attempt of one Job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub lease_id: LeaseId,
    pub job_id: ExecutionId,
    /// The fencing epoch of the attempt holding it: only that attempt's release frees it.
    pub epoch: u64,
    pub resources: Vec<(String, u32)>,
    pub granted_at_ms: u64,
}

/// J-1: a Job's standing with the resource queue, apart from its execution's head: what it
/// asks for and the lease it holds now (its place in line is its id: UUID v7, admission
/// order). Written in the same transition
/// as every change of it, so a restart finds the queue and every lease held without reading
/// any history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub job_id: ExecutionId,
    pub session_id: SessionId,
    pub resources: Vec<(String, u32)>,
    pub queued_at_ms: u64,
    pub queue_deadline_ms: Option<u64>,
    /// When it first got a lease (a queue deadline no longer applies).
    pub admitted_at_ms: Option<u64>,
    pub lease: Option<LeaseRecord>,
}

/// S-8: what a reader needs of one execution's state as of `through_seq`, so that reading
/// it (a snapshot, an activation) folds only the events after that seq, never its whole
/// history. `state` is the runtime's own encoding (`format` says which); storage keeps it as
/// bytes. A cache of the log, never the truth: a projection that cannot be used (another
/// format, a seq past the head) is ignored and the events are replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectionRecord {
    pub execution_id: ExecutionId,
    /// The last seq folded into `state`.
    pub through_seq: u64,
    pub format: u32,
    pub state: Vec<u8>,
}

/// S-8: what is left of a purged execution: it answers `purged`, never `not found`.
/// `finished` once every key it owned is gone (until then a purge resumes, after a crash
/// too); its head went in the purge's first write, so nothing of it is readable from then on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgedRecord {
    pub execution_id: ExecutionId,
    pub session_id: SessionId,
    pub purged_at_ms: u64,
    pub finished: bool,
}

/// The address of a blob: BLAKE3 of its bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BlobHash(pub [u8; 32]);

impl BlobHash {
    pub fn of(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }
}

impl fmt::Display for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "blob_{self}")
    }
}

/// Content stored once by its hash (S-5). The hash is computed here, so it always matches.
#[derive(Clone, PartialEq, Eq)]
pub struct Blob {
    hash: BlobHash,
    bytes: Vec<u8>,
}

impl Blob {
    pub fn new(bytes: Vec<u8>) -> Self {
        Self {
            hash: BlobHash::of(&bytes),
            bytes,
        }
    }

    pub fn hash(&self) -> BlobHash {
        self.hash
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob({:?}, {} bytes)", self.hash, self.bytes.len())
    }
}
