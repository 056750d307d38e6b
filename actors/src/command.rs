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
    JobBudget, ProcessId, ReceiptStatus, VersionPolicy, WaitId,
};
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

/// Every command kind of the HTTP contract (SPEC §6), built or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
    /// K-7: not built yet (`unsupported_kind`).
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

    /// The `kind` of the HTTP contract.
    pub fn as_str(self) -> &'static str {
        match self {
            CommandKind::Pause => "pause",
            CommandKind::Continue => "continue",
            CommandKind::Step => "step",
            CommandKind::Steer => "steer",
            CommandKind::Cancel => "cancel",
            CommandKind::Fork => "fork",
            CommandKind::Retry => "retry",
            CommandKind::Answer => "answer",
            CommandKind::Decline => "decline",
            CommandKind::Reconcile => "reconcile",
            CommandKind::StopProcess => "stop_process",
            CommandKind::SetPolicy => "set_policy",
            CommandKind::Revoke => "revoke",
        }
    }

    /// Whether this build runs it: the others are refused as `unsupported_kind`. Every
    /// kind the contract names is built.
    pub fn is_built(self) -> bool {
        true
    }

    pub fn parse(kind: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|known| known.as_str() == kind)
    }

    /// The fields a body of this kind may carry besides `command_id`, `kind` and
    /// `expected_version`: anything else is `unknown_field`.
    fn fields(self) -> &'static [&'static str] {
        match self {
            CommandKind::Pause | CommandKind::Step | CommandKind::Cancel | CommandKind::Retry => {
                &[]
            }
            CommandKind::Continue => &["policy", "budget"],
            CommandKind::Steer => &["text"],
            CommandKind::Fork => &["checkpoint"],
            CommandKind::Answer => &["wait_id", "answer", "scope"],
            CommandKind::Decline => &["wait_id"],
            CommandKind::Reconcile => &["outcome", "text", "effect_id"],
            CommandKind::StopProcess => &["process_id"],
            CommandKind::SetPolicy => &["policy"],
            CommandKind::Revoke => &["grant_id"],
        }
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

impl serde::Serialize for CommandKind {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
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

    fn as_str(self) -> &'static str {
        match self {
            ReconcileOutcome::Confirmed => "confirmed",
            ReconcileOutcome::NotApplied => "not_applied",
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
    /// F-3, K-7: a durable function's version policy from now on.
    SetPolicy {
        policy: VersionPolicy,
    },
    /// W-7: the grant of the approval `grant_id` approves nothing from now on.
    Revoke {
        grant_id: WaitId,
    },
}

impl CommandBody {
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
            Control::SetPolicy { policy } => CommandBody::SetPolicy { policy },
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

use crate::command_fields::{budget_of, policy_of, Reader};
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

    /// Everything but the id: what K-4 compares.
    fn payload(&self) -> Map<String, Value> {
        let mut body = Map::new();
        body.insert("kind".into(), json!(self.kind().as_str()));
        if let Some(version) = self.expected_version {
            body.insert("expected_version".into(), json!(version));
        }
        let mut put = |name: &str, value: Value| {
            body.insert(name.into(), value);
        };
        match &self.body {
            CommandBody::Pause | CommandBody::Step | CommandBody::Cancel | CommandBody::Retry => {}
            CommandBody::Continue { policy, budget } => {
                if let Some(policy) = policy {
                    put("policy", json!(policy.as_str()));
                }
                if let Some(budget) = budget {
                    put(
                        "budget",
                        json!({"steps": budget.steps, "wall_ms": budget.wall_ms}),
                    );
                }
            }
            CommandBody::Steer { text } => put("text", json!(text)),
            CommandBody::Fork { checkpoint } => {
                if let Some(seq) = checkpoint {
                    put("checkpoint", json!(seq));
                }
            }
            CommandBody::Answer {
                wait,
                answer,
                scope,
            } => {
                if let WaitRef::Id(wait_id) = wait {
                    put("wait_id", json!(wait_id));
                }
                put("answer", json!(answer));
                put("scope", json!(scope.as_str()));
            }
            CommandBody::Decline { wait } => {
                if let WaitRef::Id(wait_id) = wait {
                    put("wait_id", json!(wait_id));
                }
            }
            CommandBody::Reconcile {
                effect,
                outcome,
                text,
            } => {
                if let EffectRef::Id(effect_id) = effect {
                    put("effect_id", json!(effect_id));
                }
                put("outcome", json!(outcome.as_str()));
                put("text", json!(text));
            }
            CommandBody::StopProcess { process_id } => put("process_id", json!(process_id)),
            CommandBody::SetPolicy { policy } => put("policy", json!(policy.as_str())),
            CommandBody::Revoke { grant_id } => put("grant_id", json!(grant_id)),
        }
        body
    }

    /// K-4: the hash of everything the command says but its id. The same id with another
    /// hash is a conflict. Defaults are filled in before hashing, so a body that spells a
    /// default out and one that leaves it out are the same command.
    pub fn payload_hash(&self) -> [u8; 32] {
        // serde_json's map is ordered by key: one canonical text.
        let text = Value::Object(self.payload()).to_string();
        *blake3::hash(text.as_bytes()).as_bytes()
    }

    /// K-4: whether `stored` is this command's payload hash: the one `payload_hash` gives,
    /// or one a build before schema 6 gave the same command (a retry across the upgrade of
    /// a command stored then gets its stored outcome, not a conflict).
    pub fn matches_payload(&self, stored: &[u8; 32]) -> bool {
        self.payload_hash() == *stored || self.legacy_payload_hashes().contains(stored)
    }

    /// The payload hashes builds before schema 6 gave this command: they hashed the request
    /// as sent (`kind`, `text` and `expected_version` always, null when absent; then each
    /// other field sent, as a string), so a default left out and one spelled out hashed
    /// apart: every way of sending it is a candidate.
    pub fn legacy_payload_hashes(&self) -> Vec<[u8; 32]> {
        let id = |id: &dyn std::fmt::Display| Some(id.to_string());
        let either = |text: &str| -> Vec<Option<String>> {
            if text.is_empty() {
                vec![None, Some(String::new())]
            } else {
                vec![Some(text.to_owned())]
            }
        };
        let wait_id = |wait: &WaitRef| match wait {
            WaitRef::Pending => None,
            WaitRef::Id(wait_id) => id(wait_id),
        };
        // (text, [(field, value)]) for each way of sending it.
        type Sent = (Option<String>, Vec<(&'static str, Option<String>)>);
        let mut sent: Vec<Sent> = Vec::new();
        match &self.body {
            CommandBody::Pause
            | CommandBody::Continue {
                policy: None,
                budget: None,
            }
            | CommandBody::Step
            | CommandBody::Cancel
            | CommandBody::Retry => sent.push((None, Vec::new())),
            // Never sent by a build before schema 6: no earlier hash to match.
            CommandBody::Continue { .. } => {}
            CommandBody::Steer { text } => sent.push((Some(text.clone()), Vec::new())),
            CommandBody::Fork { checkpoint } => sent.push((
                None,
                vec![("checkpoint", checkpoint.map(|seq| seq.to_string()))],
            )),
            CommandBody::Answer {
                wait,
                answer,
                scope,
            } => {
                let scopes = match scope {
                    AnswerScope::Operation => vec![None, Some("operation".to_owned())],
                    AnswerScope::Discussion => vec![Some("discussion".to_owned())],
                    // Never sent by a build before schema 11: no earlier hash to match.
                    AnswerScope::Tool | AnswerScope::Session => Vec::new(),
                };
                for answer in either(answer) {
                    for scope in &scopes {
                        sent.push((
                            None,
                            vec![
                                ("wait_id", wait_id(wait)),
                                ("answer", answer.clone()),
                                ("scope", scope.clone()),
                            ],
                        ));
                    }
                }
            }
            CommandBody::Decline { wait } => sent.push((None, vec![("wait_id", wait_id(wait))])),
            CommandBody::Reconcile { outcome, text, .. } => {
                for text in either(text) {
                    sent.push((text, vec![("outcome", Some(outcome.as_str().to_owned()))]));
                }
            }
            CommandBody::StopProcess { process_id } => {
                sent.push((None, vec![("process_id", id(process_id))]))
            }
            // Never stored by a build before schema 6 (11): no earlier hash to match.
            CommandBody::SetPolicy { .. } | CommandBody::Revoke { .. } => {}
        }
        sent.into_iter()
            .map(|(text, fields)| {
                let mut canonical = json!({
                    "kind": self.kind().as_str(),
                    "text": text,
                    "expected_version": self.expected_version,
                });
                for (name, value) in fields {
                    if let Some(value) = value {
                        canonical[name] = json!(value);
                    }
                }
                *blake3::hash(canonical.to_string().as_bytes()).as_bytes()
            })
            .collect()
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
        let command_id = reader
            .parsed::<CommandId>("command_id")?
            .ok_or_else(|| Error::InvalidRequest("a command needs `command_id` (a UUID)".into()))?;
        let expected_version = reader.u64("expected_version")?;
        let body = match kind {
            CommandKind::Pause => CommandBody::Pause,
            CommandKind::Continue => CommandBody::Continue {
                policy: policy_of(&reader)?,
                budget: budget_of(&reader)?,
            },
            CommandKind::Step => CommandBody::Step,
            CommandKind::Cancel => CommandBody::Cancel,
            CommandKind::Retry => CommandBody::Retry,
            CommandKind::Steer => match reader.text("text")? {
                Some(text) if !text.is_empty() => CommandBody::Steer { text },
                _ => {
                    return Err(Error::InvalidRequest(
                        "steer needs a non-empty `text`".into(),
                    ))
                }
            },
            CommandKind::Fork => CommandBody::Fork {
                checkpoint: reader.u64("checkpoint")?,
            },
            CommandKind::Answer | CommandKind::Decline => {
                let wait = match reader.parsed::<WaitId>("wait_id")? {
                    Some(wait_id) => WaitRef::Id(wait_id),
                    // Without either, an answer meant for one wait could land on a newer one (W-3).
                    None if expected_version.is_none() => {
                        return Err(Error::InvalidRequest(format!(
                            "{kind} needs `wait_id`, or `expected_version` to pin the execution's pending wait"
                        )))
                    }
                    None => WaitRef::Pending,
                };
                if kind == CommandKind::Decline {
                    CommandBody::Decline { wait }
                } else {
                    let scope = match reader.text("scope")?.as_deref() {
                        None | Some("operation") => AnswerScope::Operation,
                        Some("discussion") => AnswerScope::Discussion,
                        Some("tool") => AnswerScope::Tool,
                        Some("session") => AnswerScope::Session,
                        Some(other) => {
                            return Err(Error::InvalidRequest(format!(
                                "unknown scope `{other}`: an answer approves this one `operation`, its `tool` for this execution or the `session`, or is a `discussion` reply"
                            )))
                        }
                    };
                    CommandBody::Answer {
                        wait,
                        answer: reader.text_or_json("answer")?.unwrap_or_default(),
                        scope,
                    }
                }
            }
            CommandKind::Reconcile => {
                let outcome = match reader.text("outcome")?.as_deref() {
                    Some("confirmed") => ReconcileOutcome::Confirmed,
                    Some("not_applied") => ReconcileOutcome::NotApplied,
                    _ => {
                        return Err(Error::InvalidRequest(
                            "reconcile needs `outcome`: `confirmed` or `not_applied`".into(),
                        ))
                    }
                };
                CommandBody::Reconcile {
                    effect: match reader.parsed::<EffectId>("effect_id")? {
                        Some(effect_id) => EffectRef::Id(effect_id),
                        None => EffectRef::Unresolved,
                    },
                    outcome,
                    text: reader.text("text")?.unwrap_or_default(),
                }
            }
            CommandKind::StopProcess => match reader.parsed::<ProcessId>("process_id")? {
                Some(process_id) => CommandBody::StopProcess { process_id },
                None => {
                    return Err(Error::InvalidRequest(
                        "stop_process needs `process_id`".into(),
                    ))
                }
            },
            CommandKind::Revoke => match reader.parsed::<WaitId>("grant_id")? {
                Some(grant_id) => CommandBody::Revoke { grant_id },
                None => {
                    return Err(Error::InvalidRequest(
                        "revoke needs `grant_id` (the approval that granted it)".into(),
                    ))
                }
            },
            CommandKind::SetPolicy => match policy_of(&reader)? {
                Some(policy) => CommandBody::SetPolicy { policy },
                None => {
                    return Err(Error::InvalidRequest(
                        "set_policy needs `policy`: keep_original or use_latest".into(),
                    ))
                }
            },
        };
        Ok(Self {
            command_id,
            expected_version,
            body,
        })
    }
}

#[cfg(test)]
#[path = "command_tests.rs"]
mod tests;
