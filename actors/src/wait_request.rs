//! W-6: what a structured wait asks, and the check of an answer against it. Pure: no actor,
//! no store. A request is JSON, kept as its canonical text in the wait's `WaitDetails` event:
//!
//! ```json
//! {"items": [
//!   {"id": "env", "label": "Where?", "type": "choice", "options": ["staging", "prod"]},
//!   {"id": "checks", "type": "choice", "options": ["lint", "test"], "multiple": true},
//!   {"id": "why", "type": "text", "max_length": 200, "required": false},
//!   {"id": "replicas", "type": "integer", "min": 1, "max": 10},
//!   {"id": "notify", "type": "boolean"}]}
//! ```
//!
//! or, for a permission request, `{"permission": "network", "resource": "api.example.com"}`.
//! An answer to a request with items is an object of item id → value; each item is checked
//! (`InvalidAnswer` names the first that fails). A request without items (an approval, a
//! permission) takes any answer text, as an approval always has.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What a durable wait is opened with (W-1, W-6, W-8): its kind and prompt, and optionally
/// a structured request (checked; its canonical JSON text) and a timeout. Built with
/// `approval`, `question` or `form`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WaitSpec {
    pub kind: Option<openprogram_storage::WaitKind>,
    pub prompt: String,
    pub request: Option<String>,
    pub timeout_ms: Option<u64>,
}

impl WaitSpec {
    /// An approval of the operation that follows (W-2): answered, it runs; declined, not.
    pub fn approval(prompt: &str) -> Self {
        Self {
            kind: Some(openprogram_storage::WaitKind::Approval),
            prompt: prompt.to_owned(),
            ..Self::default()
        }
    }

    /// A question with the items of `request` (`{"items": [...]}`), checked now.
    pub fn question(prompt: &str, request: &Value) -> Result<Self, String> {
        Self::structured(openprogram_storage::WaitKind::Question, prompt, request)
    }

    /// A form with the typed fields of `request` (`{"items": [...]}`), checked now.
    pub fn form(prompt: &str, request: &Value) -> Result<Self, String> {
        Self::structured(openprogram_storage::WaitKind::Form, prompt, request)
    }

    fn structured(
        kind: openprogram_storage::WaitKind,
        prompt: &str,
        request: &Value,
    ) -> Result<Self, String> {
        Ok(Self {
            kind: Some(kind),
            prompt: prompt.to_owned(),
            request: WaitRequest::from_value(request)?.map(|request| request.to_text()),
            timeout_ms: None,
        })
    }

    /// W-7: the tool this approval guards, if its request names one.
    pub fn tool(&self) -> Option<String> {
        WaitRequest::from_text(self.request.as_deref()?)
            .ok()
            .flatten()?
            .tool
    }
}

/// The most items a request may hold.
pub const ITEMS_MAX: usize = 32;
/// The most options a choice may offer.
pub const OPTIONS_MAX: usize = 64;
/// The longest id, option or short text of a request, in bytes.
pub const NAME_BYTES_MAX: usize = 256;
/// The longest text answer when the item sets no `max_length`, in characters.
pub const TEXT_CHARS_DEFAULT: u32 = 4096;

/// A structured request (W-6): the items of a question or form, or a permission asked for.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitRequest {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<Item>,
    /// A permission request: what is asked for, and on what.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// W-7: the tool an approval guards: a `tool` or `session` answer grants it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
}

/// One item of a question or form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Item {
    pub id: String,
    /// What a person reads; the id if empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label: String,
    #[serde(rename = "type")]
    pub kind: ItemKind,
    /// A choice's options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// A choice that takes several options (an array answer).
    #[serde(default, skip_serializing_if = "is_false")]
    pub multiple: bool,
    /// A choice that also takes a text of the person's own (free text).
    #[serde(default, skip_serializing_if = "is_false")]
    pub other: bool,
    /// A text's longest answer, in characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u32>,
    /// A number's bounds, inclusive, as written (an integer's stay integers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<serde_json::Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<serde_json::Number>,
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub required: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    Choice,
    Text,
    Number,
    Integer,
    Boolean,
}

fn yes() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// Why an answer does not fit its request: the item (`field`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidAnswer {
    /// The item id, or `answer` for the answer as a whole.
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for InvalidAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}`: {}", self.field, self.message)
    }
}

impl WaitRequest {
    /// Reads and checks a request from its JSON (`null` or `{}`: none).
    pub fn from_value(value: &Value) -> Result<Option<Self>, String> {
        if value.is_null() {
            return Ok(None);
        }
        let request: WaitRequest = serde_json::from_value(value.clone())
            .map_err(|error| format!("the request does not read: {error}"))?;
        request.check()?;
        Ok((request != WaitRequest::default()).then_some(request))
    }

    /// Reads a request as its event keeps it.
    pub fn from_text(text: &str) -> Result<Option<Self>, String> {
        let value: Value = serde_json::from_str(text)
            .map_err(|error| format!("the request is not JSON: {error}"))?;
        Self::from_value(&value)
    }

    /// Its canonical JSON text (as stored).
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The request's own rules: ids unique and short, options where a choice needs them,
    /// bounds only on numbers, a permission without items.
    pub fn check(&self) -> Result<(), String> {
        if self.items.len() > ITEMS_MAX {
            return Err(format!("a request holds at most {ITEMS_MAX} items"));
        }
        if self.permission.is_some() && !self.items.is_empty() {
            return Err("a permission request has no items".into());
        }
        if self.tool.is_some() && !self.items.is_empty() {
            return Err("`tool` belongs to an approval, which has no items".into());
        }
        if self
            .tool
            .as_ref()
            .is_some_and(|tool| tool.is_empty() || tool.len() > NAME_BYTES_MAX)
        {
            return Err(format!("a tool name is 1 to {NAME_BYTES_MAX} bytes"));
        }
        if self.resource.is_some() && self.permission.is_none() {
            return Err("`resource` belongs to a permission request".into());
        }
        for text in self.permission.iter().chain(&self.resource) {
            if text.is_empty() || text.len() > NAME_BYTES_MAX {
                return Err(format!(
                    "a permission and its resource are 1 to {NAME_BYTES_MAX} bytes"
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for item in &self.items {
            let named = |message: &str| format!("item `{}`: {message}", item.id);
            if item.id.is_empty() || item.id.len() > NAME_BYTES_MAX {
                return Err(format!("an item id is 1 to {NAME_BYTES_MAX} bytes"));
            }
            if !seen.insert(item.id.as_str()) {
                return Err(named("the id is used twice"));
            }
            if item.label.len() > 4 * NAME_BYTES_MAX {
                return Err(named("the label is too long"));
            }
            let choice = item.kind == ItemKind::Choice;
            if choice && item.options.is_empty() {
                return Err(named("a choice needs options"));
            }
            if !choice && (!item.options.is_empty() || item.multiple || item.other) {
                return Err(named("options, multiple and other belong to a choice"));
            }
            if item.options.len() > OPTIONS_MAX {
                return Err(named(&format!("at most {OPTIONS_MAX} options")));
            }
            let mut options = std::collections::BTreeSet::new();
            for option in &item.options {
                if option.is_empty() || option.len() > NAME_BYTES_MAX {
                    return Err(named(&format!("an option is 1 to {NAME_BYTES_MAX} bytes")));
                }
                if !options.insert(option) {
                    return Err(named(&format!("option `{option}` is listed twice")));
                }
            }
            let number = matches!(item.kind, ItemKind::Number | ItemKind::Integer);
            if !number && (item.min.is_some() || item.max.is_some()) {
                return Err(named("min and max belong to a number"));
            }
            if let (Some(min), Some(max)) = (item.min_f64(), item.max_f64()) {
                if min > max {
                    return Err(named("min is above max"));
                }
            }
            if item.max_length.is_some() && item.kind != ItemKind::Text {
                return Err(named("max_length belongs to a text"));
            }
        }
        Ok(())
    }

    /// Checks `answer` (JSON text) against the items, and gives back its canonical text. A
    /// request without items takes any answer as it is.
    pub fn validate(&self, answer: &str) -> Result<String, InvalidAnswer> {
        if self.items.is_empty() {
            return Ok(answer.to_owned());
        }
        let whole = |message: &str| InvalidAnswer {
            field: "answer".into(),
            message: message.into(),
        };
        let Ok(Value::Object(given)) = serde_json::from_str(answer) else {
            return Err(whole("an object of item id → value is expected"));
        };
        if let Some(unknown) = given
            .keys()
            .find(|id| !self.items.iter().any(|item| &item.id == *id))
        {
            return Err(InvalidAnswer {
                field: unknown.clone(),
                message: "the request has no such item".into(),
            });
        }
        let mut answered = Map::new();
        for item in &self.items {
            match given.get(&item.id).filter(|value| !value.is_null()) {
                None if item.required => {
                    return Err(item.invalid("an answer is required"));
                }
                None => {}
                Some(value) => {
                    item.check_value(value)?;
                    answered.insert(item.id.clone(), value.clone());
                }
            }
        }
        Ok(Value::Object(answered).to_string())
    }
}

impl Item {
    fn min_f64(&self) -> Option<f64> {
        self.min.as_ref().and_then(serde_json::Number::as_f64)
    }

    fn max_f64(&self) -> Option<f64> {
        self.max.as_ref().and_then(serde_json::Number::as_f64)
    }

    fn invalid(&self, message: impl Into<String>) -> InvalidAnswer {
        InvalidAnswer {
            field: self.id.clone(),
            message: message.into(),
        }
    }

    fn check_value(&self, value: &Value) -> Result<(), InvalidAnswer> {
        match self.kind {
            ItemKind::Choice if self.multiple => {
                let Value::Array(picked) = value else {
                    return Err(self.invalid("a list of options is expected"));
                };
                if picked.is_empty() && self.required {
                    return Err(self.invalid("pick at least one option"));
                }
                let mut seen = std::collections::BTreeSet::new();
                for one in picked {
                    let text = self.choice(one)?;
                    if !seen.insert(text) {
                        return Err(self.invalid(format!("`{text}` is picked twice")));
                    }
                }
                Ok(())
            }
            ItemKind::Choice => self.choice(value).map(|_| ()),
            ItemKind::Text => {
                let Value::String(text) = value else {
                    return Err(self.invalid("a text is expected"));
                };
                let max = self.max_length.unwrap_or(TEXT_CHARS_DEFAULT);
                if text.chars().count() > max as usize {
                    return Err(self.invalid(format!("longer than {max} characters")));
                }
                if self.required && text.trim().is_empty() {
                    return Err(self.invalid("an answer is required"));
                }
                Ok(())
            }
            ItemKind::Number | ItemKind::Integer => {
                let Some(number) = value.as_f64() else {
                    return Err(self.invalid("a number is expected"));
                };
                if self.kind == ItemKind::Integer && !(value.is_i64() || value.is_u64()) {
                    return Err(self.invalid("a whole number is expected"));
                }
                if let Some(min) = self.min.as_ref().filter(|_| self.min_f64() > Some(number)) {
                    return Err(self.invalid(format!("below the minimum {min}")));
                }
                if let Some(max) = self
                    .max
                    .as_ref()
                    .filter(|_| self.max_f64().is_some_and(|max| number > max))
                {
                    return Err(self.invalid(format!("above the maximum {max}")));
                }
                Ok(())
            }
            ItemKind::Boolean if value.is_boolean() => Ok(()),
            ItemKind::Boolean => Err(self.invalid("true or false is expected")),
        }
    }

    /// One picked option: one of the options, or (with `other`) a short text of one's own.
    fn choice<'v>(&self, value: &'v Value) -> Result<&'v str, InvalidAnswer> {
        let Value::String(text) = value else {
            return Err(self.invalid("an option is expected"));
        };
        if self.options.iter().any(|option| option == text) {
            return Ok(text);
        }
        if self.other && !text.trim().is_empty() && text.len() <= NAME_BYTES_MAX * 4 {
            return Ok(text);
        }
        Err(self.invalid(format!(
            "`{text}` is not one of: {}",
            self.options.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request() -> WaitRequest {
        WaitRequest::from_value(&json!({"items": [
            {"id": "env", "label": "Where?", "type": "choice", "options": ["staging", "prod"]},
            {"id": "checks", "type": "choice", "options": ["lint", "test"], "multiple": true},
            {"id": "why", "type": "text", "max_length": 5, "required": false},
            {"id": "replicas", "type": "integer", "min": 1, "max": 10},
            {"id": "ratio", "type": "number", "max": 1.0, "required": false},
            {"id": "notify", "type": "boolean"},
            {"id": "owner", "type": "choice", "options": ["me"], "other": true, "required": false}
        ]}))
        .expect("a valid request")
        .expect("items")
    }

    fn field_of(answer: Value) -> String {
        request()
            .validate(&answer.to_string())
            .expect_err("refused")
            .field
    }

    #[test]
    fn w6_an_integer_bound_reads_back_as_an_integer() {
        let text = request().to_text();
        assert!(text.contains(r#""min":1,"max":10"#), "{text}");
    }

    #[test]
    fn w6_an_answer_that_fits_reads_back_canonical() {
        let answer = json!({"notify": true, "env": "prod", "checks": ["test", "lint"],
            "replicas": 3, "owner": "someone else", "why": null});
        let canonical = request().validate(&answer.to_string()).expect("fits");
        let read: Value = serde_json::from_str(&canonical).expect("json");
        assert_eq!(read["env"], "prod");
        assert!(read.get("why").is_none(), "a null is no answer");
    }

    #[test]
    fn w6_each_kind_of_wrong_answer_names_its_field() {
        let good = json!({"env": "prod", "checks": ["lint"], "replicas": 3, "notify": false});
        let with = |key: &str, value: Value| {
            let mut answer = good.clone();
            answer[key] = value;
            answer
        };
        assert!(request().validate(&good.to_string()).is_ok());
        assert_eq!(field_of(with("env", json!("dev"))), "env", "not an option");
        assert_eq!(field_of(with("checks", json!(["lint", "lint"]))), "checks");
        assert_eq!(field_of(with("checks", json!([]))), "checks", "required");
        assert_eq!(field_of(with("checks", json!("lint"))), "checks", "a list");
        assert_eq!(field_of(with("why", json!("too long"))), "why");
        assert_eq!(
            field_of(with("replicas", json!(11))),
            "replicas",
            "above max"
        );
        assert_eq!(field_of(with("replicas", json!(2.5))), "replicas", "whole");
        assert_eq!(field_of(with("ratio", json!(1.5))), "ratio");
        assert_eq!(field_of(with("notify", json!("yes"))), "notify");
        assert_eq!(field_of(with("owner", json!("  "))), "owner", "blank other");
        assert_eq!(field_of(with("extra", json!(1))), "extra", "unknown item");
        let mut missing = good.clone();
        missing.as_object_mut().expect("object").remove("env");
        assert_eq!(field_of(missing), "env", "required");
        assert_eq!(field_of(json!(["env"])), "answer", "not an object");
        let not_json = request().validate("prod").expect_err("refused");
        assert_eq!(not_json.field, "answer");
    }

    #[test]
    fn w6_a_request_that_breaks_its_own_rules_is_refused() {
        for bad in [
            json!({"items": [{"id": "a", "type": "choice"}]}),
            json!({"items": [{"id": "a", "type": "text"}, {"id": "a", "type": "text"}]}),
            json!({"items": [{"id": "", "type": "text"}]}),
            json!({"items": [{"id": "a", "type": "text", "options": ["x"]}]}),
            json!({"items": [{"id": "a", "type": "integer", "min": 3, "max": 1}]}),
            json!({"items": [{"id": "a", "type": "boolean", "max_length": 3}]}),
            json!({"items": [{"id": "a", "type": "choice", "options": ["x", "x"]}]}),
            json!({"items": [{"id": "a", "type": "colour"}]}),
            json!({"items": [{"id": "a", "type": "text", "colour": 1}]}),
            json!({"permission": "network", "items": [{"id": "a", "type": "text"}]}),
            json!({"resource": "x"}),
        ] {
            assert!(WaitRequest::from_value(&bad).is_err(), "{bad}");
        }
        assert_eq!(WaitRequest::from_value(&json!({})), Ok(None));
        let permission = WaitRequest::from_value(&json!({"permission": "network"}))
            .expect("valid")
            .expect("some");
        assert_eq!(permission.validate("yes"), Ok("yes".into()), "any text");
    }
}
