//! The scripted provider's script (SPEC §6): what one element, as the JSON text a client
//! sent, decides — a tool call, a reply, an approval or structured wait (W-6, W-7), a
//! function call (F-6) — or `{"digest": true}`, which `agent::Scripted` answers itself.

use crate::machine::{AskDetails, AskKind, Decision, ToolArgs};

/// The keys of a script element the provider reads, each borrowed as its JSON text (`null`
/// included): a tool's arguments go into the decision as the text they are, never built
/// into a tree. An element is an object; one naming a key twice is refused.
#[derive(Default, serde::Deserialize)]
#[serde(default, bound(deserialize = "'de: 'a"))]
struct Element<'a> {
    tool: Raw<'a>,
    args: Raw<'a>,
    reply: Raw<'a>,
    ask: Raw<'a>,
    call: Raw<'a>,
    input: Raw<'a>,
    /// W-6: `{"question": PROMPT, "items": [...]}`, `{"form": PROMPT, "items": [...]}`,
    /// `{"permission": NAME, "resource": R?}`; any wait may take `timeout_ms` (W-8).
    question: Raw<'a>,
    form: Raw<'a>,
    permission: Raw<'a>,
    resource: Raw<'a>,
    items: Raw<'a>,
    timeout_ms: Raw<'a>,
    /// E-3: what the model said beside a tool call, and its reasoning blocks.
    text: Raw<'a>,
    reasoning: Raw<'a>,
}

/// A key's value as JSON text, `None` if the key is absent (`Option` would also take `null`
/// for absent).
#[derive(Default)]
struct Raw<'a>(Option<&'a serde_json::value::RawValue>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Raw<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <&serde_json::value::RawValue>::deserialize(deserializer).map(|raw| Raw(Some(raw)))
    }
}

/// Whether a script element is `{"digest": true}`. Parsed only if the key may be there: the
/// provider takes an element per step.
pub(crate) fn is_digest(element: &str) -> bool {
    if !element.contains("\"digest\"") {
        return false;
    }
    #[derive(serde::Deserialize)]
    struct Digest {
        digest: bool,
    }
    serde_json::from_str::<Digest>(element).is_ok_and(|element| element.digest)
}

/// The decision a script element (its JSON text) names.
pub(crate) fn scripted_decision(element: &str) -> Result<Decision, String> {
    let unrecognized = || format!("unrecognized script element {element}");
    if !element.trim_start().starts_with('{') {
        return Err(unrecognized());
    }
    let parsed: Element = serde_json::from_str(element).map_err(|_| unrecognized())?;
    let text = |raw: Raw| {
        raw.0
            .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
    };
    let reasoning = match parsed.reasoning.0 {
        None => Vec::new(),
        Some(raw) => serde_json::from_str::<Vec<String>>(raw.get())
            .map_err(|_| format!("`reasoning` is a list of texts in {element}"))?,
    };
    let timeout_ms = match parsed.timeout_ms.0 {
        None => None,
        Some(raw) => Some(
            serde_json::from_str::<u64>(raw.get())
                .map_err(|_| format!("`timeout_ms` is a whole number in {element}"))?,
        ),
    };
    // W-7: `{"ask": PROMPT, "tool": NAME}` approves the call of NAME that follows: a
    // `tool` or `session` answer grants it.
    if let (Some(prompt), Some(tool)) = (text(Raw(parsed.ask.0)), text(Raw(parsed.tool.0))) {
        return Ok(Decision::Ask {
            prompt,
            wait: Some(AskDetails {
                kind: AskKind::Approval,
                request: Some(serde_json::json!({ "tool": tool })),
                timeout_ms,
            }),
        });
    }
    if let Some(tool) = text(parsed.tool) {
        let args = match parsed.args.0 {
            Some(args) => ToolArgs::from_raw(args),
            None => ToolArgs::from_text("{}").map_err(|_| unrecognized())?,
        };
        let said = text(parsed.text).unwrap_or_default();
        return Ok(Decision::tool(tool, args)
            .with_text(said)
            .with_reasoning(reasoning));
    }
    if let Some(text) = text(parsed.reply) {
        return Ok(Decision::reply(text).with_reasoning(reasoning));
    }
    let items = parsed
        .items
        .0
        .and_then(|raw| serde_json::from_str::<serde_json::Value>(raw.get()).ok());
    let ask = |prompt: String, kind: AskKind, request: Option<serde_json::Value>| {
        let wait = (kind != AskKind::Approval || request.is_some() || timeout_ms.is_some())
            .then_some(AskDetails {
                kind,
                request,
                timeout_ms,
            });
        Ok(Decision::Ask { prompt, wait })
    };
    if let Some(prompt) = text(parsed.ask) {
        return ask(prompt, AskKind::Approval, None);
    }
    for (raw, kind) in [
        (parsed.question, AskKind::Question),
        (parsed.form, AskKind::Form),
    ] {
        if let Some(prompt) = text(raw) {
            let items = items.clone().unwrap_or_else(|| serde_json::json!([]));
            let request = serde_json::json!({ "items": items });
            return ask(prompt, kind, Some(request));
        }
    }
    if let Some(permission) = text(parsed.permission) {
        let resource = text(parsed.resource);
        let prompt = match &resource {
            Some(resource) => format!("Allow {permission} on {resource}?"),
            None => format!("Allow {permission}?"),
        };
        let request = serde_json::json!({"permission": permission, "resource": resource});
        return ask(prompt, AskKind::Permission, Some(request));
    }
    // F-6: `{"call": FUNCTION, "input": {...}}` is a call of the `call` tool.
    if let Some(function) = parsed.call.0.filter(|_| text(Raw(parsed.call.0)).is_some()) {
        let input = parsed.input.0.map_or("null", |input| input.get());
        let args = format!("{{\"function\":{},\"input\":{input}}}", function.get());
        let args = ToolArgs::from_text(args).map_err(|_| unrecognized())?;
        return Ok(Decision::tool("call".into(), args));
    }
    Err(unrecognized())
}

#[cfg(test)]
#[path = "script_tests.rs"]
mod tests;
