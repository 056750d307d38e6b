//! What a command's id stands for (K-4): the hash of everything the command says but its
//! id, and the hashes builds before schema 6 gave the same command, so that a retry across
//! the upgrade of a command stored then gets its stored outcome, not a conflict.

use openprogram_storage::AnswerScope;
use serde_json::{json, Value};

use crate::command::{Command, CommandBody, WaitRef};

impl Command {
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
        self.matches_payload_with(stored, |hash| hash)
    }

    /// `matches_payload` where what is stored is each hash passed through `stored_as` (a
    /// fork's record also names its parent).
    pub fn matches_payload_with(
        &self,
        stored: &[u8; 32],
        stored_as: impl Fn([u8; 32]) -> [u8; 32],
    ) -> bool {
        let same = |hash: [u8; 32]| stored_as(hash) == *stored;
        same(self.payload_hash()) || self.legacy_payload_hashes().into_iter().any(same)
    }

    /// The payload hashes builds before schema 6 gave this command: they hashed the request
    /// as sent (`kind`, `text` and `expected_version` always, null when absent; then each
    /// other field sent, as a string), so a default left out and one spelled out hashed
    /// apart: every way of sending it is a candidate.
    pub fn legacy_payload_hashes(&self) -> Vec<[u8; 32]> {
        // An empty text was sent as empty or left out; a null field was not sent.
        let either = |text: &str| match text {
            "" => vec![Value::Null, json!("")],
            text => vec![json!(text)],
        };
        let wait_id = |wait: &WaitRef| match wait {
            WaitRef::Pending => Value::Null,
            WaitRef::Id(wait_id) => json!(wait_id.to_string()),
        };
        // The fields of each way of sending it.
        let sent: Vec<Value> = match &self.body {
            CommandBody::Pause
            | CommandBody::Continue {
                policy: None,
                budget: None,
            }
            | CommandBody::Step
            | CommandBody::Cancel
            | CommandBody::Retry => vec![json!({})],
            // Never sent by a build before schema 6 (11 for a revoke): no earlier hash to match.
            CommandBody::Continue { .. }
            | CommandBody::SetPolicy { .. }
            | CommandBody::Revoke { .. } => Vec::new(),
            CommandBody::Steer { text } => vec![json!({ "text": text })],
            CommandBody::Fork { checkpoint } => {
                vec![json!({"checkpoint": checkpoint.map(|seq| seq.to_string())})]
            }
            CommandBody::Answer {
                wait,
                answer,
                scope,
            } => {
                let scopes = match scope {
                    AnswerScope::Operation => vec![Value::Null, json!("operation")],
                    AnswerScope::Discussion => vec![json!("discussion")],
                    // Never sent by a build before schema 11: no earlier hash to match.
                    AnswerScope::Tool | AnswerScope::Session => Vec::new(),
                };
                let answers = either(answer).into_iter();
                answers
                    .flat_map(|answer| {
                        let wait_id = wait_id(wait);
                        scopes.iter().map(move |scope| {
                            json!({"wait_id": wait_id, "answer": answer, "scope": scope})
                        })
                    })
                    .collect()
            }
            CommandBody::Decline { wait } => vec![json!({ "wait_id": wait_id(wait) })],
            CommandBody::Reconcile { outcome, text, .. } => either(text)
                .into_iter()
                .map(|text| json!({"text": text, "outcome": outcome.as_str()}))
                .collect(),
            CommandBody::StopProcess { process_id } => {
                vec![json!({"process_id": process_id.to_string()})]
            }
        };
        sent.into_iter()
            .map(|fields| {
                let mut canonical = json!({
                    "kind": self.kind().as_str(),
                    "text": null,
                    "expected_version": self.expected_version,
                });
                let fields = fields.as_object().into_iter().flatten();
                for (name, value) in fields.filter(|(_, value)| !value.is_null()) {
                    canonical[name] = value.clone();
                }
                *blake3::hash(canonical.to_string().as_bytes()).as_bytes()
            })
            .collect()
    }
}
