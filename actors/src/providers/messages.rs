//! The conversation a model request carries, built from committed context only: the user's
//! message, then each decision and result in order, then steer texts. Both APIs are written
//! from this one form, so a request regenerated after a crash is the request made before it.

use openprogram_storage::{ReceiptStatus, WaitStatus};

use crate::agent::{Decision, ModelRequest, Turn};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Part {
    Text(String),
    /// A tool call the model made; `id` pairs it with its result.
    ToolCall {
        id: String,
        name: String,
        arguments: String,
    },
    ToolResult {
        id: String,
        content: String,
        is_error: bool,
    },
}

/// One message: a role and its parts; consecutive parts of one role share a message.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Message {
    pub(super) role: Role,
    pub(super) parts: Vec<Part>,
}

/// The messages of `request`, alternating roles.
pub(super) fn conversation(request: &ModelRequest) -> Vec<Message> {
    let mut messages = Vec::new();
    push(
        &mut messages,
        Role::User,
        Part::Text(request.input.message.clone()),
    );
    // Tool calls are numbered in the order they were decided; a result answers the call
    // decided last (one call is in flight at a time).
    let mut calls = 0u32;
    for turn in request.context.iter() {
        match turn {
            Turn::Decided(Decision::Tool {
                tool, args, text, ..
            }) => {
                calls += 1;
                if !text.is_empty() {
                    push(&mut messages, Role::Assistant, Part::Text(text.clone()));
                }
                push(
                    &mut messages,
                    Role::Assistant,
                    Part::ToolCall {
                        id: call_id(calls),
                        name: tool.clone(),
                        arguments: args.get().to_owned(),
                    },
                );
            }
            Turn::Decided(Decision::Reply { text, .. }) => {
                push(&mut messages, Role::Assistant, Part::Text(text.clone()));
            }
            Turn::Decided(Decision::Ask { prompt, .. }) => {
                push(&mut messages, Role::Assistant, Part::Text(prompt.clone()));
            }
            Turn::ToolResult { status, output, .. } => {
                let (content, is_error) = match status {
                    ReceiptStatus::Confirmed => (output.clone(), false),
                    ReceiptStatus::Failed => (output.clone(), true),
                    other => (format!("[{}] {output}", status_name(*other)), true),
                };
                push(
                    &mut messages,
                    Role::User,
                    Part::ToolResult {
                        id: call_id(calls.max(1)),
                        content,
                        is_error,
                    },
                );
            }
            Turn::WaitResolved {
                prompt,
                status,
                answer,
                ..
            } => {
                let text = match (status, answer) {
                    (WaitStatus::Answered, Some(answer)) => format!("{prompt}\n{answer}"),
                    (WaitStatus::Answered, None) => format!("{prompt}\n[approved]"),
                    (status, _) => format!("{prompt}\n[{}]", wait_name(*status)),
                };
                push(&mut messages, Role::User, Part::Text(text));
            }
        }
    }
    for steer in &request.steers {
        push(&mut messages, Role::User, Part::Text(steer.clone()));
    }
    messages
}

fn push(messages: &mut Vec<Message>, role: Role, part: Part) {
    match messages.last_mut() {
        Some(last) if last.role == role => last.parts.push(part),
        _ => messages.push(Message {
            role,
            parts: vec![part],
        }),
    }
}

/// `call00001`: nine letters and digits, which every API accepts (Mistral's demand exactly
/// that).
fn call_id(n: u32) -> String {
    format!("call{n:05}")
}

fn status_name(status: ReceiptStatus) -> &'static str {
    match status {
        ReceiptStatus::Confirmed => "confirmed",
        ReceiptStatus::Failed => "failed",
        ReceiptStatus::NotStarted => "not started",
        ReceiptStatus::Unknown => "outcome unknown",
        ReceiptStatus::NotApplied => "not applied",
        ReceiptStatus::Dispatched => "dispatched",
    }
}

fn wait_name(status: WaitStatus) -> String {
    format!("{status:?}").to_lowercase()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::agent::{AgentInput, ToolArgs};
    use openprogram_storage::{EffectId, ExecutionId};

    fn request(context: Vec<Turn>, steers: Vec<String>) -> ModelRequest {
        ModelRequest {
            execution_id: ExecutionId::new(),
            effect_id: EffectId::new(),
            input: Arc::new(AgentInput {
                message: "hi".into(),
                script: Vec::new(),
                max_iterations: 10,
            }),
            context: Arc::new(context),
            iterations: 0,
            steers,
            used: Default::default(),
            usage: Default::default(),
            deltas: Default::default(),
        }
    }

    #[test]
    fn e3_a_regenerated_request_pairs_each_result_with_its_call() {
        let call = |tool: &str| {
            Turn::Decided(Decision::tool(
                tool.into(),
                ToolArgs::from_text(r#"{"text":"x"}"#).unwrap(),
            ))
        };
        let result = |output: &str, status| Turn::ToolResult {
            tool: "echo".into(),
            status,
            output: output.into(),
        };
        let messages = conversation(&request(
            vec![
                call("echo"),
                result("one", ReceiptStatus::Confirmed),
                call("fail"),
                result("boom", ReceiptStatus::Failed),
            ],
            vec!["shorter please".into()],
        ));
        let roles: Vec<Role> = messages.iter().map(|message| message.role).collect();
        assert_eq!(
            roles,
            [
                Role::User,
                Role::Assistant,
                Role::User,
                Role::Assistant,
                Role::User
            ]
        );
        assert!(matches!(&messages[1].parts[0], Part::ToolCall { id, .. } if id == "call00001"));
        assert!(matches!(&messages[2].parts[0],
            Part::ToolResult { id, content, is_error: false } if id == "call00001" && content == "one"));
        assert!(matches!(&messages[4].parts[0],
            Part::ToolResult { id, is_error: true, .. } if id == "call00002"));
        // The steer follows the last result in the same user message.
        assert_eq!(messages[4].parts[1], Part::Text("shorter please".into()));
    }
}
