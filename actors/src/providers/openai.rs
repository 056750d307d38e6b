//! The OpenAI chat-completions wire format, as OpenAI-compatible servers speak it.

use serde_json::{json, Value};

use super::config::ProviderConfig;
use super::response::{clip, Response, ToolCallOut, Usage};
use super::sse;
use super::transport::{event_json, read_json, Failure};
use crate::context::{Message, Part, Role};
use crate::deltas::DeltaSink;

pub(super) fn request_body(config: &ProviderConfig, conversation: &[Message]) -> Value {
    let mut messages = Vec::new();
    if let Some(system) = &config.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    for message in conversation {
        match message.role {
            Role::User => user_messages(message, &mut messages),
            Role::Assistant => messages.push(assistant_message(message)),
        }
    }
    let mut body = json!({"model": config.model, "messages": messages});
    if !config.tools.is_empty() {
        body["tools"] = config
            .tools
            .iter()
            .map(|spec| {
                json!({"type": "function", "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": spec.parameters,
                }})
            })
            .collect();
    }
    if let Some(max_tokens) = config.max_tokens {
        body["max_tokens"] = json!(max_tokens);
    }
    if config.stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// A user turn: each tool result as a `tool` message (they must follow the call), then the
/// text.
fn user_messages(message: &Message, messages: &mut Vec<Value>) {
    let mut text = Vec::new();
    for part in &message.parts {
        match part {
            Part::ToolResult { id, content, .. } => {
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            Part::Text(part) => text.push(part.as_str()),
            Part::ToolCall { .. } => {}
        }
    }
    if !text.is_empty() {
        messages.push(json!({"role": "user", "content": text.join("\n\n")}));
    }
}

fn assistant_message(message: &Message) -> Value {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    for part in &message.parts {
        match part {
            Part::Text(part) => text.push(part.as_str()),
            Part::ToolCall {
                id,
                name,
                arguments,
            } => calls.push(json!({"id": id, "type": "function",
                "function": {"name": name, "arguments": arguments}})),
            Part::ToolResult { .. } => {}
        }
    }
    let mut value = json!({"role": "assistant",
        "content": if text.is_empty() { Value::Null } else { json!(text.join("\n\n")) }});
    if !calls.is_empty() {
        value["tool_calls"] = Value::Array(calls);
    }
    value
}

pub(super) async fn read_whole(response: reqwest::Response) -> Result<Response, Failure> {
    let (value, body) = read_json(response).await?;
    if let Some(error) = value.get("error") {
        return Err(Failure::Fatal(format!(
            "the model answered an error: {}",
            error_text(error)
        )));
    }
    let choice = value
        .pointer("/choices/0")
        .ok_or_else(|| Failure::Fatal(format!("the response has no choice: {}", clip(&body))))?;
    let message = choice
        .get("message")
        .ok_or_else(|| Failure::Fatal(format!("the choice has no message: {}", clip(&body))))?;
    let mut out = Response {
        text: message["content"].as_str().unwrap_or_default().to_owned(),
        // DeepSeek, vLLM and llama.cpp return reasoning beside the content.
        reasoning: ["reasoning_content", "reasoning"]
            .iter()
            .find_map(|field| message[*field].as_str())
            .filter(|reasoning| !reasoning.is_empty())
            .map(|reasoning| vec![reasoning.to_owned()])
            .unwrap_or_default(),
        refusal: message["refusal"].as_str().map(str::to_owned),
        stop_reason: choice["finish_reason"].as_str().map(str::to_owned),
        usage: usage(&value["usage"]),
        ..Response::default()
    };
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        let function = &call["function"];
        let (Some(name), Some(arguments)) =
            (function["name"].as_str(), function["arguments"].as_str())
        else {
            return Err(Failure::Fatal(format!(
                "a tool call lacks its name or arguments: {}",
                clip(&call.to_string())
            )));
        };
        out.tool_calls.push(ToolCallOut {
            name: name.to_owned(),
            arguments: arguments.to_owned(),
        });
    }
    Ok(out)
}

/// A streamed response as far as it has arrived: whole at `data: [DONE]`, or at a finish
/// reason and the end of the body.
#[derive(Debug, Default)]
pub(super) struct Stream {
    out: Response,
    finished: bool,
    /// Where each piece goes as it arrives (E-3).
    deltas: DeltaSink,
}

impl Stream {
    pub(super) fn new(deltas: DeltaSink) -> Self {
        Self {
            deltas,
            ..Self::default()
        }
    }
}

impl super::transport::Stream for Stream {
    fn take(&mut self, event: &sse::Event) -> Result<bool, Failure> {
        if event.data == "[DONE]" {
            // A stream that never said why it stopped is not whole.
            return Ok(self.finished);
        }
        let chunk = event_json(event)?;
        if let Some(error) = chunk.get("error") {
            return Err(Failure::retry(format!(
                "the stream carried an error: {}",
                error_text(error)
            )));
        }
        if chunk["usage"].is_object() {
            self.out.usage = usage(&chunk["usage"]);
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return Ok(false);
        };
        let delta = &choice["delta"];
        if let Some(text) = delta["content"].as_str() {
            self.deltas.text(text);
            self.out.text.push_str(text);
        }
        // DeepSeek, vLLM and llama.cpp stream reasoning beside the content: one block, from
        // the first of the two names a piece carries (some servers send both, alike).
        let reasoning = ["reasoning_content", "reasoning"]
            .iter()
            .find_map(|field| delta[*field].as_str())
            .filter(|piece| !piece.is_empty());
        if let Some(reasoning) = reasoning {
            self.deltas.reasoning(reasoning);
            match self.out.reasoning.last_mut() {
                Some(block) => block.push_str(reasoning),
                None => self.out.reasoning.push(reasoning.to_owned()),
            }
        }
        if let Some(refusal) = delta["refusal"].as_str() {
            self.out
                .refusal
                .get_or_insert_with(String::new)
                .push_str(refusal);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap_or(0) as usize;
            if index >= 128 {
                return Err(Failure::Fatal(format!("a tool call index of {index}")));
            }
            if self.out.tool_calls.len() <= index {
                self.out
                    .tool_calls
                    .resize(index + 1, ToolCallOut::default());
            }
            let out = &mut self.out.tool_calls[index];
            // The name comes once; some servers repeat it whole in every piece.
            match call["function"]["name"].as_str() {
                Some(name) if out.name.is_empty() => out.name.push_str(name),
                _ => {}
            }
            if let Some(arguments) = call["function"]["arguments"].as_str() {
                out.arguments.push_str(arguments);
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finished = true;
            self.out.stop_reason = Some(reason.to_owned());
        }
        Ok(false)
    }

    fn finish(self, _ended: bool) -> Option<Response> {
        self.finished.then_some(self.out)
    }
}

fn usage(value: &Value) -> Usage {
    Usage {
        input: value["prompt_tokens"].as_u64().unwrap_or(0),
        output: value["completion_tokens"].as_u64().unwrap_or(0),
    }
}

fn error_text(error: &Value) -> String {
    match error["message"].as_str() {
        Some(message) => clip(message),
        None => clip(&error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::transport::Stream as _;
    use super::*;

    fn take_all(stream: &str) -> Result<(Response, bool), Failure> {
        let mut parser = sse::Parser::default();
        let mut state = Stream::default();
        for event in parser.push(stream.as_bytes()) {
            if state.take(&event)? {
                return Ok((state.out, true));
            }
        }
        let finished = state.finished;
        Ok((state.out, finished))
    }

    #[test]
    fn e3_a_streamed_tool_call_is_assembled_from_its_pieces() {
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"echo\",\"arguments\":\"\"}}]}}]}\n\n",
            // Some servers repeat the whole name in every piece.
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"echo\",\"arguments\":\"{\\\"text\\\":\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"hi\\\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5}}\n\n",
            "data: [DONE]\n\n",
        );
        let (out, done) = take_all(stream).unwrap_or_else(|_| panic!("stream refused"));
        assert!(done);
        assert_eq!(
            out.tool_calls,
            vec![ToolCallOut {
                name: "echo".into(),
                arguments: "{\"text\":\"hi\"}".into()
            }]
        );
        assert_eq!(
            out.usage,
            Usage {
                input: 12,
                output: 5
            }
        );
    }

    #[test]
    fn e3_a_stream_without_its_end_is_not_complete() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n";
        let (out, done) = take_all(stream).unwrap_or_else(|_| panic!("stream refused"));
        assert_eq!(out.text, "Hel");
        assert!(!done, "a half response must not count as complete");
    }
}
