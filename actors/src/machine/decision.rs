//! A provider's decision as the machine records it (E-3): `Decision` (a tool call with what
//! the model said beside it, a reply, or an `Ask` and the wait it opens: W-1, W-6..W-8) and
//! the JSON texts it is kept as (`ToolArgs`, `decision_text`). Pure data.

use serde::{Deserialize, Serialize};

/// A tool call's arguments, kept as their JSON text from the provider's decision to the
/// tool: the decision's event carries the text as it is, the context and the pending call
/// share it, and the tool gets it parsed once (`ToolCall::args`). Built from a value
/// (`From<serde_json::Value>`), from text (`from_text`) or from a `RawValue` (`from_raw`).
/// Two are equal when their texts are, as for `ScriptElement`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ToolArgs(std::sync::Arc<serde_json::value::RawValue>);

impl ToolArgs {
    /// Arguments from JSON text; an error if it is not JSON.
    pub fn from_text(text: impl Into<String>) -> Result<Self, serde_json::Error> {
        serde_json::value::RawValue::from_string(text.into()).map(|raw| Self(raw.into()))
    }

    /// Arguments already read as JSON (a borrowed `RawValue`): copied, not parsed again.
    pub fn from_raw(raw: &serde_json::value::RawValue) -> Self {
        Self(raw.to_owned().into())
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    pub fn parse(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }
}

impl From<serde_json::Value> for ToolArgs {
    fn from(value: serde_json::Value) -> Self {
        // A `Value` always writes valid JSON, so the fallback is never taken.
        Self::from_text(value.to_string()).unwrap_or_else(|_| Self::default())
    }
}

impl Default for ToolArgs {
    /// `null`: no arguments.
    fn default() -> Self {
        Self(serde_json::value::RawValue::NULL.to_owned().into())
    }
}

impl PartialEq for ToolArgs {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

/// A provider decision (E-3): call a tool, or reply and finish. What the model said beside
/// it is kept with it: the text that came with a tool call, and its reasoning blocks (where
/// the API returns them), so the checkpoint holds all the model produced. Build one with
/// `Decision::tool` or `Decision::reply`, then `with_text`/`with_reasoning`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Tool {
        tool: String,
        args: ToolArgs,
        /// What the model said with the call (shown to it again in later requests).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        text: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        reasoning: Vec<String>,
    },
    Reply {
        text: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        reasoning: Vec<String>,
    },
    /// Ask the user for approval before the next operation (W-1): a durable wait at a
    /// checkpoint. Approved, the provider goes on; declined, it gets the decline instead.
    /// `wait` makes it a question, form or permission request with a structured request
    /// (W-6), and may give it a timeout (W-8).
    Ask {
        prompt: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait: Option<AskDetails>,
    },
}

/// What a model's `Ask` asks beyond its prompt (W-6, W-8).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AskDetails {
    #[serde(default)]
    pub kind: AskKind,
    /// A `WaitRequest` as JSON (checked when the decision is recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// The kind of wait an `Ask` opens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AskKind {
    #[default]
    Approval,
    Question,
    Form,
    Permission,
}

impl AskKind {
    pub fn wait_kind(self) -> openprogram_storage::WaitKind {
        use openprogram_storage::WaitKind;
        match self {
            AskKind::Approval => WaitKind::Approval,
            AskKind::Question => WaitKind::Question,
            AskKind::Form => WaitKind::Form,
            AskKind::Permission => WaitKind::Permission,
        }
    }

    /// The kind named `name` (`approval`, `question`, `form`, `permission`).
    pub fn parse(name: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(name.to_owned())).ok()
    }
}

impl Decision {
    /// The wait an `Ask` opens, its request checked (W-6): `None` for another decision.
    pub fn wait_spec(&self) -> Option<Result<super::wait_types::WaitSpec, String>> {
        let Decision::Ask { prompt, wait } = self else {
            return None;
        };
        let details = wait.clone().unwrap_or_default();
        let request = match details
            .request
            .as_ref()
            .map(crate::wait_request::WaitRequest::from_value)
        {
            None | Some(Ok(None)) => None,
            Some(Ok(Some(request))) => Some(request.to_text()),
            Some(Err(error)) => return Some(Err(error)),
        };
        Some(Ok(super::wait_types::WaitSpec {
            kind: Some(details.kind.wait_kind()),
            prompt: prompt.clone(),
            request,
            timeout_ms: details.timeout_ms,
        }))
    }

    /// Call `tool` with `args`.
    pub fn tool(tool: String, args: ToolArgs) -> Self {
        Self::Tool {
            tool,
            args,
            text: String::new(),
            reasoning: Vec::new(),
        }
    }

    /// Reply `text` and finish.
    pub fn reply(text: String) -> Self {
        Self::Reply {
            text,
            reasoning: Vec::new(),
        }
    }

    /// A tool call with the text the model said beside it (a reply's text is its own).
    pub fn with_text(mut self, said: String) -> Self {
        if let Self::Tool { text, .. } = &mut self {
            *text = said;
        }
        self
    }

    /// The model's reasoning blocks, in order (an approval keeps none).
    pub fn with_reasoning(mut self, blocks: Vec<String>) -> Self {
        if let Self::Tool { reasoning, .. } | Self::Reply { reasoning, .. } = &mut self {
            *reasoning = blocks;
        }
        self
    }
}

/// A decision as the JSON text its event records, written into a buffer sized for it up front
/// (a tool's arguments or the text are most of it; escapes may still grow it).
pub(crate) fn decision_text(decision: &Decision) -> String {
    let len = match decision {
        Decision::Tool {
            tool,
            args,
            text,
            reasoning,
        } => {
            tool.len()
                + args.get().len()
                + text.len()
                + reasoning.iter().map(String::len).sum::<usize>()
        }
        Decision::Reply { text, reasoning } => {
            text.len() + reasoning.iter().map(String::len).sum::<usize>()
        }
        Decision::Ask { prompt, .. } => prompt.len() + 64,
    };
    let mut text = Vec::with_capacity(len + 32);
    // Serializing strings and raw JSON text into a Vec cannot fail; if it did, no half text.
    if serde_json::to_writer(&mut text, decision).is_err() {
        return String::new();
    }
    String::from_utf8(text).unwrap_or_default()
}
