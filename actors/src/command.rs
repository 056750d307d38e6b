//! The typed command (K-1..K-4, X-3): one value from the CLI flag or the HTTP body to the
//! log. A command is its id, the version its sender saw, and a body tagged by its kind
//! that carries exactly that kind's arguments. It is parsed once (`Command::from_json`:
//! unknown fields, unknown and unbuilt kinds and malformed arguments are request errors,
//! nothing is stored) and decided once, by the pure state machine
//! (`Machine::decide_command`), which also says which kinds it would accept now (K-3).
//!
//! What this module does not do: decide anything that depends on an execution's state.
//! "The wait the execution is waiting on" is a reference (`WaitRef::Pending`) that the
//! machine resolves, never a nil id.

use openprogram_storage::{
    AnswerScope, CommandId, CommandRecord, CommandStatus, Control, EffectId, ExecutionId,
    JobBudget, ProcessId, ReceiptStatus, RestartWindow, VersionPolicy, WaitId,
};
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

/// Every command kind of the HTTP contract (SPEC §6), built or not. Serialized as its
/// `as_str`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandKind {
    Pause,
    Continue,
    Step,
    Steer,
    Cancel,
    Fork,
    Retry,
    Answer,
    Decline,
    Reconcile,
    StopProcess,
    /// F-3, K-7: a function's version policy and an execution's own restart window.
    SetPolicy,
    /// W-7: a grant approves nothing from now on.
    Revoke,
}

impl CommandKind {
    /// Every kind, in the contract's order.
    pub const ALL: [CommandKind; 13] = [
        CommandKind::Pause,
        CommandKind::Continue,
        CommandKind::Step,
        CommandKind::Steer,
        CommandKind::Cancel,
        CommandKind::Fork,
        CommandKind::Retry,
        CommandKind::Answer,
        CommandKind::Decline,
        CommandKind::Reconcile,
        CommandKind::StopProcess,
        CommandKind::SetPolicy,
        CommandKind::Revoke,
    ];

    /// Each kind's name in the HTTP contract and the fields its body may carry besides
    /// `command_id`, `kind` and `expected_version` (anything else is `unknown_field`, X-3),
    /// in the order the enum declares the kinds.
    const TABLE: [(&'static str, &'static [&'static str]); 13] = [
        ("pause", &[]),
        ("continue", &["policy", "budget"]),
        ("step", &[]),
        ("steer", &["text"]),
        ("cancel", &[]),
        ("fork", &["checkpoint"]),
        ("retry", &[]),
        ("answer", &["wait_id", "answer", "scope"]),
        ("decline", &["wait_id"]),
        ("reconcile", &["outcome", "text", "effect_id"]),
        ("stop_process", &["process_id"]),
        ("set_policy", &["policy", "restart_window"]),
        ("revoke", &["grant_id"]),
    ];

    /// The `kind` of the HTTP contract.
    pub fn as_str(self) -> &'static str {
        Self::TABLE[self as usize].0
    }

    /// Whether this build runs it: the others are refused as `unsupported_kind`. Every
    /// kind the contract names is built.
    pub fn is_built(self) -> bool {
        true
    }

    pub fn parse(kind: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|known| known.as_str() == kind)
    }

    fn fields(self) -> &'static [&'static str] {
        Self::TABLE[self as usize].1
    }
}

impl std::fmt::Display for CommandKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for CommandKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Which wait an `answer` or `decline` is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitRef {
    /// The durable wait the execution is waiting on now. Only with `expected_version`, so
    /// an answer meant for one wait never lands on a newer one (W-3).
    Pending,
    Id(WaitId),
}

/// Which effect a `reconcile` resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffectRef {
    /// The one effect awaiting reconciliation (an operator's reconcile).
    Unresolved,
    /// A named effect (a tool's reconcile protocol, R-8).
    Id(EffectId),
}

/// How `reconcile` resolves an unknown effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileOutcome {
    Confirmed,
    NotApplied,
}

impl ReconcileOutcome {
    pub fn status(self) -> ReceiptStatus {
        match self {
            ReconcileOutcome::Confirmed => ReceiptStatus::Confirmed,
            ReconcileOutcome::NotApplied => ReceiptStatus::NotApplied,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReconcileOutcome::Confirmed => "confirmed",
            ReconcileOutcome::NotApplied => "not_applied",
        }
    }

    /// A reconcile's `outcome`, which it cannot go without.
    fn read(reader: &Reader) -> Result<Self> {
        match reader.text("outcome")?.as_deref() {
            Some("confirmed") => Ok(ReconcileOutcome::Confirmed),
            Some("not_applied") => Ok(ReconcileOutcome::NotApplied),
            _ => Err(Error::InvalidRequest(
                "reconcile needs `outcome`: `confirmed` or `not_applied`".into(),
            )),
        }
    }
}

/// A command's kind with exactly its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandBody {
    Pause,
    /// `policy`: F-3, a function's version policy from now on, in the same transition.
    /// `budget`: J-1, a Job's new budget (totals), in the same transition.
    Continue {
        policy: Option<VersionPolicy>,
        budget: Option<JobBudget>,
    },
    Step,
    Steer {
        text: String,
    },
    Cancel,
    /// From `checkpoint` (a checkpoint seq), or the latest saved point.
    Fork {
        checkpoint: Option<u64>,
    },
    Retry,
    Answer {
        wait: WaitRef,
        answer: String,
        scope: AnswerScope,
    },
    Decline {
        wait: WaitRef,
    },
    /// `text`: the effect's output, for `confirmed`.
    Reconcile {
        effect: EffectRef,
        outcome: ReconcileOutcome,
        text: String,
    },
    StopProcess {
        process_id: ProcessId,
    },
    /// F-3, K-7: a durable function's version policy, and the execution's own restart
    /// window, from now on (at least one of them).
    SetPolicy {
        policy: Option<VersionPolicy>,
        restart_window: Option<RestartWindow>,
    },
    /// W-7: the grant of the approval `grant_id` approves nothing from now on.
    Revoke {
        grant_id: WaitId,
    },
}

impl CommandBody {
    /// Continue with nothing more (no version policy, no new budget): built as `Pause`,
    /// `Step` and `Cancel` are.
    pub fn continue_() -> Self {
        CommandBody::Continue {
            policy: None,
            budget: None,
        }
    }

    pub fn kind(&self) -> CommandKind {
        match self {
            CommandBody::Pause => CommandKind::Pause,
            CommandBody::Continue { .. } => CommandKind::Continue,
            CommandBody::Step => CommandKind::Step,
            CommandBody::Steer { .. } => CommandKind::Steer,
            CommandBody::Cancel => CommandKind::Cancel,
            CommandBody::Fork { .. } => CommandKind::Fork,
            CommandBody::Retry => CommandKind::Retry,
            CommandBody::Answer { .. } => CommandKind::Answer,
            CommandBody::Decline { .. } => CommandKind::Decline,
            CommandBody::Reconcile { .. } => CommandKind::Reconcile,
            CommandBody::StopProcess { .. } => CommandKind::StopProcess,
            CommandBody::SetPolicy { .. } => CommandKind::SetPolicy,
            CommandBody::Revoke { .. } => CommandKind::Revoke,
        }
    }

    /// The body of a `kind` from its fields, checked against the kind's list already; the
    /// fields are read in the order their errors are reported.
    fn read(kind: CommandKind, reader: &Reader, expected_version: Option<u64>) -> Result<Self> {
        let wait = || match reader.parsed::<WaitId>("wait_id")? {
            Some(wait_id) => Ok(WaitRef::Id(wait_id)),
            // Without either, an answer meant for one wait could land on a newer one (W-3).
            None if expected_version.is_none() => Err(unpinned(kind)),
            None => Ok(WaitRef::Pending),
        };
        Ok(match kind {
            CommandKind::Pause => CommandBody::Pause,
            CommandKind::Continue => CommandBody::Continue {
                policy: policy_of(reader)?,
                budget: budget_of(reader)?,
            },
            CommandKind::Step => CommandBody::Step,
            CommandKind::Cancel => CommandBody::Cancel,
            CommandKind::Retry => CommandBody::Retry,
            CommandKind::Steer => {
                let text = reader.text("text")?.filter(|text| !text.is_empty());
                let text = required(text, "steer needs a non-empty `text`")?;
                CommandBody::Steer { text }
            }
            CommandKind::Fork => CommandBody::Fork {
                checkpoint: reader.u64("checkpoint")?,
            },
            CommandKind::Answer => CommandBody::Answer {
                wait: wait()?,
                scope: scope_of(reader)?,
                answer: reader.text_or_json("answer")?.unwrap_or_default(),
            },
            CommandKind::Decline => CommandBody::Decline { wait: wait()? },
            CommandKind::Reconcile => CommandBody::Reconcile {
                outcome: ReconcileOutcome::read(reader)?,
                effect: reader
                    .parsed("effect_id")?
                    .map_or(EffectRef::Unresolved, EffectRef::Id),
                text: reader.text("text")?.unwrap_or_default(),
            },
            CommandKind::StopProcess => {
                let process_id = reader.parsed::<ProcessId>("process_id")?;
                let process_id = required(process_id, "stop_process needs `process_id`")?;
                CommandBody::StopProcess { process_id }
            }
            CommandKind::Revoke => {
                let grant_id = reader.parsed::<WaitId>("grant_id")?;
                let message = "revoke needs `grant_id` (the approval that granted it)";
                CommandBody::Revoke {
                    grant_id: required(grant_id, message)?,
                }
            }
            CommandKind::SetPolicy => {
                let (policy, restart_window) = (policy_of(reader)?, restart_window_of(reader)?);
                if policy.is_none() && restart_window.is_none() {
                    return Err(Error::InvalidRequest(
                        "set_policy needs `policy` (keep_original or use_latest) or \
                         `restart_window` (-1, 0 or a duration like \"2h\")"
                            .into(),
                    ));
                }
                CommandBody::SetPolicy {
                    policy,
                    restart_window,
                }
            }
        })
    }
}

/// A control already resolved against its execution (stored in `ControlAccepted`) is the
/// body that names exactly what it resolved to.
impl From<Control> for CommandBody {
    fn from(control: Control) -> Self {
        match control {
            Control::Pause => CommandBody::Pause,
            Control::Continue => CommandBody::Continue {
                policy: None,
                budget: None,
            },
            Control::Step => CommandBody::Step,
            Control::Steer { text } => CommandBody::Steer { text },
            Control::Cancel => CommandBody::Cancel,
            // Every writer of a reconcile control (this parser, a tool's protocol) wrote
            // `Confirmed` or `NotApplied`: those are the only statuses stored here.
            Control::Reconcile {
                effect_id,
                status,
                output,
            } => CommandBody::Reconcile {
                effect: EffectRef::Id(effect_id),
                outcome: match status {
                    ReceiptStatus::Confirmed => ReconcileOutcome::Confirmed,
                    _ => ReconcileOutcome::NotApplied,
                },
                text: output,
            },
            Control::Answer {
                wait_id,
                answer,
                scope,
            } => CommandBody::Answer {
                wait: WaitRef::Id(wait_id),
                answer,
                scope,
            },
            Control::SetPolicy { policy } => CommandBody::SetPolicy {
                policy: Some(policy),
                restart_window: None,
            },
            Control::SetExecutionPolicy {
                version_policy,
                restart_window,
            } => CommandBody::SetPolicy {
                policy: version_policy,
                restart_window: Some(restart_window),
            },
            Control::Decline { wait_id } => CommandBody::Decline {
                wait: WaitRef::Id(wait_id),
            },
            Control::StopProcess { process_id } => CommandBody::StopProcess { process_id },
            Control::Revoke { grant_id } => CommandBody::Revoke { grant_id },
        }
    }
}

/// One command: its id (K-4), the version its sender saw (stale: rejected), its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub command_id: CommandId,
    pub expected_version: Option<u64>,
    pub body: CommandBody,
}

use crate::command_fields::{budget_of, policy_of, required, restart_window_of, scope_of, Reader};
pub use crate::command_fields::{parse_budget, TEXT_BYTES_MAX};

impl Command {
    /// A command with a fresh id and no expected version.
    pub fn new(body: CommandBody) -> Self {
        Self {
            command_id: CommandId::new(),
            expected_version: None,
            body,
        }
    }

    pub fn with_id(mut self, command_id: CommandId) -> Self {
        self.command_id = command_id;
        self
    }

    pub fn expecting(mut self, version: u64) -> Self {
        self.expected_version = Some(version);
        self
    }

    pub fn kind(&self) -> CommandKind {
        self.body.kind()
    }

    /// The command's record as it is saved `accepted` for `execution_id` (K-1), before
    /// its decision fills in the rest.
    pub fn accepted_record(&self, execution_id: ExecutionId) -> CommandRecord {
        CommandRecord {
            command_id: self.command_id,
            execution_id,
            kind: self.kind().as_str().to_owned(),
            payload_hash: self.payload_hash(),
            status: CommandStatus::Accepted,
            reason: None,
            reason_code: None,
            result_version: None,
            child_execution_id: None,
            accepted_at_ms: 0,
        }
    }

    /// The body of `POST …/commands` (SPEC §6), as a client sends it. `from_json` reads
    /// it back to the same command.
    pub fn to_json(&self) -> Value {
        let mut body = self.payload();
        body.insert("command_id".into(), json!(self.command_id));
        Value::Object(body)
    }

    /// Everything but the id: what K-4 compares. A field the command leaves out is absent
    /// (no field is ever `null`).
    pub(crate) fn payload(&self) -> Map<String, Value> {
        let wait_id = |wait: &WaitRef| match wait {
            WaitRef::Id(wait_id) => json!(wait_id),
            WaitRef::Pending => Value::Null,
        };
        let fields = match &self.body {
            CommandBody::Pause | CommandBody::Step | CommandBody::Cancel | CommandBody::Retry => {
                json!({})
            }
            CommandBody::Continue { policy, budget } => json!({
                "policy": policy.map(VersionPolicy::as_str),
                "budget": budget.map(|JobBudget { steps, wall_ms }| {
                    json!({"steps": steps, "wall_ms": wall_ms})
                }),
            }),
            CommandBody::Steer { text } => json!({ "text": text }),
            CommandBody::Fork { checkpoint } => json!({ "checkpoint": checkpoint }),
            CommandBody::Answer {
                wait,
                answer,
                scope,
            } => json!({"wait_id": wait_id(wait), "answer": answer, "scope": scope.as_str()}),
            CommandBody::Decline { wait } => json!({ "wait_id": wait_id(wait) }),
            CommandBody::Reconcile {
                effect,
                outcome,
                text,
            } => json!({
                "effect_id": match effect {
                    EffectRef::Id(effect_id) => json!(effect_id),
                    EffectRef::Unresolved => Value::Null,
                },
                "outcome": outcome.as_str(),
                "text": text,
            }),
            CommandBody::StopProcess { process_id } => json!({ "process_id": process_id }),
            CommandBody::SetPolicy {
                policy,
                restart_window,
            } => json!({
                "policy": policy.map(VersionPolicy::as_str),
                "restart_window": restart_window.map(|window| window.to_string()),
            }),
            CommandBody::Revoke { grant_id } => json!({ "grant_id": grant_id }),
        };
        let Value::Object(mut body) = fields else {
            unreachable!("each body's fields are written as an object above")
        };
        body.retain(|_, value| !value.is_null());
        body.insert("kind".into(), json!(self.kind().as_str()));
        if let Some(version) = self.expected_version {
            body.insert("expected_version".into(), json!(version));
        }
        body
    }

    /// W-3, for a command built in code as for one read from JSON: an answer or decline of
    /// "the pending wait" pins it to the version its sender saw; without it, it could land on
    /// a newer wait.
    pub fn check(&self) -> Result<()> {
        let pending = matches!(
            &self.body,
            CommandBody::Answer {
                wait: WaitRef::Pending,
                ..
            } | CommandBody::Decline {
                wait: WaitRef::Pending
            }
        );
        match pending && self.expected_version.is_none() {
            true => Err(unpinned(self.kind())),
            false => Ok(()),
        }
    }

    /// Reads a command body (SPEC §6). A field the kind does not take is `unknown_field`; a
    /// kind the contract names but this build does not run is `unsupported_kind`; any other
    /// kind is `unknown_kind`; a missing or malformed argument is `invalid_request`.
    pub fn from_json(body: &Value) -> Result<Self> {
        let Value::Object(fields) = body else {
            return Err(Error::InvalidRequest("a command is a JSON object".into()));
        };
        let kind_text = match fields.get("kind") {
            Some(Value::String(kind)) => kind.as_str(),
            Some(_) => return Err(Error::InvalidRequest("`kind` is a string".into())),
            None => return Err(Error::InvalidRequest("a command needs `kind`".into())),
        };
        let Some(kind) = CommandKind::parse(kind_text) else {
            return Err(Error::UnknownKind(format!(
                "`{kind_text}` is not a command kind; the kinds are {}",
                CommandKind::ALL.map(CommandKind::as_str).join(", ")
            )));
        };
        for name in fields.keys() {
            let common = matches!(name.as_str(), "command_id" | "kind" | "expected_version");
            if !common && !kind.fields().contains(&name.as_str()) {
                return Err(Error::UnknownField {
                    field: name.clone(),
                    message: format!("a `{kind}` command has no field `{name}`"),
                });
            }
        }
        let reader = Reader(fields);
        let command_id = reader.parsed::<CommandId>("command_id")?;
        let command_id = required(command_id, "a command needs `command_id` (a UUID)")?;
        let expected_version = reader.u64("expected_version")?;
        let body = CommandBody::read(kind, &reader, expected_version)?;
        Ok(Self {
            command_id,
            expected_version,
            body,
        })
    }
}

/// W-3: an answer or decline that names no wait and pins none.
fn unpinned(kind: CommandKind) -> Error {
    Error::InvalidRequest(format!(
        "{kind} needs `wait_id`, or `expected_version` to pin the execution's pending wait"
    ))
}

#[cfg(test)]
#[path = "command_tests.rs"]
mod tests;
