//! The Anthropic Messages wire format.

use serde_json::{json, Value};

use super::config::ProviderConfig;
use super::response::{clip, Response, ToolCallOut, Usage};
use super::sse;
use super::transport::{event_json, read_json, Failure};
use crate::context::{Message, Part};
use crate::deltas::DeltaSink;

/// The response's token limit when the configuration sets none (the API requires one).
const MAX_TOKENS_DEFAULT: u32 = 4096;

pub(super) fn request_body(config: &ProviderConfig, conversation: &[Message]) -> Value {
    let messages: Vec<Value> = conversation
        .iter()
        .map(|message| {
            let role = message.role.as_str();
            let mut blocks: Vec<Value> = message.parts.iter().filter_map(block).collect();
            if blocks.is_empty() {
                // The API refuses a message without content, and an empty text block.
                blocks.push(json!({"type": "text", "text": "(empty)"}));
            }
            json!({"role": role, "content": blocks})
        })
        .collect();
    let mut body = json!({
        "model": config.model,
        "max_tokens": config.max_tokens.unwrap_or(MAX_TOKENS_DEFAULT),
        "messages": messages,
    });
    if let Some(system) = &config.system {
        body["system"] = json!(system);
    }
    if !config.tools.is_empty() {
        body["tools"] = config
            .tools
            .iter()
            .map(|spec| {
                json!({"name": spec.name, "description": spec.description,
                    "input_schema": spec.parameters})
            })
            .collect();
        body["tool_choice"] = json!({"type": "auto", "disable_parallel_tool_use": true});
    }
    if config.stream {
        body["stream"] = json!(true);
    }
    body
}

fn block(part: &Part) -> Option<Value> {
    match part {
        Part::Text(text) if text.trim().is_empty() => None,
        Part::Text(text) => Some(json!({"type": "text", "text": text})),
        Part::ToolCall {
            id,
            name,
            arguments,
        } => {
            // The arguments were JSON when the decision was recorded.
            let input: Value = serde_json::from_str(arguments).unwrap_or_else(|_| json!({}));
            Some(json!({"type": "tool_use", "id": id, "name": name, "input": input}))
        }
        Part::ToolResult {
            id,
            content,
            is_error,
        } => Some(
            json!({"type": "tool_result", "tool_use_id": id, "content": content,
            "is_error": is_error}),
        ),
    }
}

pub(super) async fn read_whole(response: reqwest::Response) -> Result<Response, Failure> {
    let (value, body) = read_json(response).await?;
    if value["type"] == "error" {
        return Err(error_failure(&value["error"]));
    }
    let Some(content) = value["content"].as_array() else {
        return Err(Failure::Fatal(format!(
            "the response has no content: {}",
            clip(&body)
        )));
    };
    let mut out = Response {
        usage: Usage {
            input: value["usage"]["input_tokens"].as_u64().unwrap_or(0),
            output: value["usage"]["output_tokens"].as_u64().unwrap_or(0),
        },
        ..Response::default()
    };
    for block in content {
        match block["type"].as_str() {
            Some("text") => out
                .text
                .push_str(block["text"].as_str().unwrap_or_default()),
            Some("tool_use") => {
                let Some(name) = block["name"].as_str() else {
                    return Err(Failure::Fatal(format!(
                        "a tool_use block has no name: {}",
                        clip(&block.to_string())
                    )));
                };
                out.tool_calls.push(ToolCallOut {
                    name: name.to_owned(),
                    arguments: block["input"].to_string(),
                });
            }
            Some("thinking") => out
                .reasoning
                .push(block["thinking"].as_str().unwrap_or_default().to_owned()),
            _ => {}
        }
    }
    stop_reason(&mut out, value["stop_reason"].as_str());
    Ok(out)
}

fn stop_reason(out: &mut Response, reason: Option<&str>) {
    match reason {
        Some("refusal") => {
            let text = if out.text.is_empty() {
                "(no reason given)".into()
            } else {
                out.text.clone()
            };
            out.refusal = Some(text);
        }
        reason => out.stop_reason = reason.map(str::to_owned),
    }
}

/// An `error` object: overloaded and internal errors are retried, the rest are the answer.
fn error_failure(error: &Value) -> Failure {
    let kind = error["type"].as_str().unwrap_or("error");
    let message = format!(
        "{kind}: {}",
        clip(error["message"].as_str().unwrap_or_default())
    );
    match kind {
        "overloaded_error" | "api_error" | "rate_limit_error" | "timeout_error" => {
            Failure::retry(message)
        }
        _ => Failure::Fatal(message),
    }
}

/// A streamed response as far as it has arrived; whole at its `message_stop`.
#[derive(Debug, Default)]
pub(super) struct Stream {
    /// Content blocks by index: a text block's text, or a tool call being assembled.
    blocks: Vec<Block>,
    stop_reason: Option<String>,
    usage: Usage,
    /// Where each piece goes as it arrives (E-3).
    deltas: DeltaSink,
}

#[derive(Debug, Default, Clone)]
struct Block {
    text: String,
    tool: Option<ToolCallOut>,
    /// A thinking block's text.
    thinking: Option<String>,
}

impl Block {
    /// Adds a block's start or one of its deltas.
    fn add(&mut self, piece: &Value, deltas: &DeltaSink) {
        match piece["type"].as_str() {
            Some("text" | "text_delta") => {
                let text = piece["text"].as_str().unwrap_or_default();
                deltas.text(text);
                self.text.push_str(text);
            }
            Some("thinking" | "thinking_delta") => {
                let thinking = piece["thinking"].as_str().unwrap_or_default();
                deltas.reasoning(thinking);
                let block = self.thinking.get_or_insert_with(String::new);
                block.push_str(thinking);
            }
            Some("tool_use") => {
                self.tool = Some(ToolCallOut {
                    name: piece["name"].as_str().unwrap_or_default().to_owned(),
                    arguments: String::new(),
                });
            }
            Some("input_json_delta") => {
                if let Some(tool) = &mut self.tool {
                    let json = piece["partial_json"].as_str().unwrap_or_default();
                    tool.arguments.push_str(json);
                }
            }
            _ => {}
        }
    }
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
        if event.name == "ping" {
            return Ok(false);
        }
        let value = event_json(event)?;
        match value["type"].as_str().unwrap_or(event.name.as_str()) {
            "message_start" => {
                self.usage.input = value["message"]["usage"]["input_tokens"]
                    .as_u64()
                    .unwrap_or(0);
            }
            kind @ ("content_block_start" | "content_block_delta") => {
                let piece = match kind {
                    "content_block_start" => &value["content_block"],
                    _ => &value["delta"],
                };
                // The block the event's `index` names, created if new.
                let index = value["index"].as_u64().unwrap_or(0) as usize;
                if index >= 1024 {
                    return Err(Failure::Fatal(format!("a content block index of {index}")));
                }
                if self.blocks.len() <= index {
                    self.blocks.resize(index + 1, Block::default());
                }
                self.blocks[index].add(piece, &self.deltas);
            }
            "message_delta" => {
                if let Some(reason) = value["delta"]["stop_reason"].as_str() {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(output) = value["usage"]["output_tokens"].as_u64() {
                    self.usage.output = output;
                }
            }
            "message_stop" => return Ok(true),
            "error" => return Err(error_failure(&value["error"])),
            _ => {}
        }
        Ok(false)
    }

    /// The whole response, once `message_stop` has `ended` the stream.
    fn finish(self, ended: bool) -> Option<Response> {
        if !ended {
            return None;
        }
        let mut out = Response {
            usage: self.usage,
            ..Response::default()
        };
        for block in self.blocks {
            match (block.tool, block.thinking) {
                (Some(mut tool), _) => {
                    if tool.arguments.trim().is_empty() {
                        tool.arguments = "{}".into();
                    }
                    out.tool_calls.push(tool);
                }
                (None, Some(thinking)) => out.reasoning.push(thinking),
                (None, None) => out.text.push_str(&block.text),
            }
        }
        stop_reason(&mut out, self.stop_reason.as_deref());
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::transport::Stream as _;
    use super::*;

    #[test]
    fn e3_a_streamed_message_with_text_and_a_tool_call_is_assembled() {
        let stream = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Look it up.\"}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: ping\ndata: {\"type\": \"ping\"}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Let me look.\"}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"echo\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"text\\\": \"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\"x\\\"}\"}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":9}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let mut parser = sse::Parser::default();
        let mut state = Stream::default();
        let mut done = false;
        for event in parser.push(stream.as_bytes()) {
            done = state.take(&event).unwrap_or_else(|_| panic!("refused"));
        }
        assert!(done);
        let out = state.finish(done).unwrap_or_else(|| panic!("not whole"));
        assert_eq!(out.text, "Let me look.");
        assert_eq!(out.reasoning, vec!["Look it up.".to_owned()]);
        assert_eq!(out.tool_calls[0].name, "echo");
        assert_eq!(out.tool_calls[0].arguments, "{\"text\": \"x\"}");
        assert_eq!(
            out.usage,
            Usage {
                input: 20,
                output: 9
            }
        );
    }

    #[test]
    fn e6_an_overloaded_stream_is_retried_and_a_bad_request_is_not() {
        assert!(matches!(
            error_failure(&json!({"type": "overloaded_error", "message": "busy"})),
            Failure::Retry { .. }
        ));
        assert!(matches!(
            error_failure(&json!({"type": "invalid_request_error", "message": "no"})),
            Failure::Fatal(message) if message.contains("no")
        ));
    }
}
