//! A model's whole response, as both APIs' readers hand it to the provider.

/// A whole model response, whichever API it came from.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Response {
    pub(crate) text: String,
    /// The model's reasoning (thinking) blocks, in order, where the API returns them.
    pub(crate) reasoning: Vec<String>,
    pub(crate) tool_calls: Vec<ToolCallOut>,
    /// The model declined to answer (OpenAI's `refusal`, Anthropic's `refusal` stop reason).
    pub(crate) refusal: Option<String>,
    /// Why the model stopped, as the API said it (`None`: it did not say).
    pub(crate) stop_reason: Option<String>,
    pub(crate) usage: Usage,
}

/// A tool call a model made: its name and its arguments as JSON text.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ToolCallOut {
    pub(crate) name: String,
    pub(crate) arguments: String,
}

/// Tokens a response used, as the provider counted them.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Usage {
    pub(crate) input: u64,
    pub(crate) output: u64,
}

/// At most 200 characters of `text`, for an error message.
pub(crate) fn clip(text: &str) -> String {
    match text.char_indices().nth(200) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Whether a stop reason means the response is whole: a reply or tool call the model finished.
/// Anything else (`length`, `max_tokens`, `content_filter`, a context window exceeded, a
/// reason not known here) is a response cut short, never a decision.
pub(crate) fn complete(reason: Option<&str>) -> bool {
    matches!(
        reason,
        None | Some(
            "stop" | "tool_calls" | "function_call" | "end_turn" | "tool_use" | "stop_sequence"
        )
    )
}
