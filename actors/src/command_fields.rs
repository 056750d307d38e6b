//! Reading a command body's fields: typed, bounded, `null` the same as absent; a
//! `policy` (F-3), a `restart_window` (K-7), a `budget` (J-1) and an answer's `scope` (W-7).
//! `command.rs` puts them
//! together into a body.

use openprogram_storage::{AnswerScope, JobBudget, RestartWindow, VersionPolicy};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The longest text a command carries (steer text, an answer, a reconcile output).
pub const TEXT_BYTES_MAX: usize = 16 * 1024;

/// A command's `policy` (F-3), if given: `keep_original` or `use_latest`.
pub(crate) fn policy_of(reader: &Reader) -> Result<Option<VersionPolicy>> {
    match reader.text("policy")?.as_deref() {
        None => Ok(None),
        Some(text) => VersionPolicy::parse(text).map(Some).ok_or_else(|| {
            Error::InvalidRequest(format!(
                "`{text}` is not a version policy: keep_original or use_latest"
            ))
        }),
    }
}

/// K-7: a restart window as JSON gives it: `-1` (no limit), `0` (no automatic restart), or
/// a duration (`"90s"`, `"15m"`, `"2h"`, `"1d"`, `"500ms"`; a bare number is seconds).
pub(crate) fn restart_window(value: &Value) -> std::result::Result<RestartWindow, String> {
    match value {
        Value::String(text) => text.parse(),
        Value::Number(number) => number.to_string().parse(),
        _ => Err("a restart window is -1, 0 or a duration like \"90s\" or \"2h\"".into()),
    }
}

/// K-7: the `restart_window` of a command body, if any.
pub(crate) fn restart_window_of(reader: &Reader) -> Result<Option<RestartWindow>> {
    reader
        .get("restart_window")
        .map(|value| restart_window(value).map_err(Error::InvalidRequest))
        .transpose()
}

/// An answer's `scope`: `operation` when absent.
pub(crate) fn scope_of(reader: &Reader) -> Result<AnswerScope> {
    match reader.text("scope")?.as_deref() {
        None | Some("operation") => Ok(AnswerScope::Operation),
        Some("discussion") => Ok(AnswerScope::Discussion),
        Some("tool") => Ok(AnswerScope::Tool),
        Some("session") => Ok(AnswerScope::Session),
        Some(other) => Err(Error::InvalidRequest(format!(
            "unknown scope `{other}`: an answer approves this one `operation`, its `tool` for this execution or the `session`, or is a `discussion` reply"
        ))),
    }
}

/// A field a body cannot go without: absent, it is `invalid_request` with `message`.
pub(crate) fn required<T>(value: Option<T>, message: &str) -> Result<T> {
    value.ok_or_else(|| Error::InvalidRequest(message.to_owned()))
}

/// J-1: `budget` — `{"steps": N?, "wall_ms": N?}`, each a total.
pub(crate) fn budget_of(reader: &Reader) -> Result<Option<JobBudget>> {
    let Some(value) = reader.get("budget") else {
        return Ok(None);
    };
    parse_budget(value).map(Some)
}

/// A budget as JSON (`{"steps": N?, "wall_ms": N?}`): another field is `unknown_field`
/// (`budget.NAME`), anything else `invalid_request`.
pub fn parse_budget(value: &Value) -> Result<JobBudget> {
    let invalid = |message: &str| Error::InvalidRequest(format!("`budget` {message}"));
    let Value::Object(fields) = value else {
        return Err(invalid("must be an object with `steps` and/or `wall_ms`"));
    };
    let mut budget = JobBudget::default();
    for (name, value) in fields {
        if !matches!(name.as_str(), "steps" | "wall_ms") {
            return Err(Error::UnknownField {
                field: format!("budget.{name}"),
                message: format!("`budget` has no field `{name}`"),
            });
        }
        if value.is_null() {
            continue;
        }
        let number = value
            .as_u64()
            .ok_or_else(|| invalid(&format!("`{name}` must be a whole number")))?;
        if name == "steps" {
            let steps =
                u32::try_from(number).map_err(|_| invalid("`steps` is larger than 4294967295"))?;
            budget.steps = Some(steps);
        } else {
            budget.wall_ms = Some(number);
        }
    }
    Ok(budget)
}

/// Reads the typed fields of a command body; `null` is the same as absent.
pub(crate) struct Reader<'a>(pub(crate) &'a Map<String, Value>);

impl Reader<'_> {
    pub(crate) fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|value| !value.is_null())
    }

    pub(crate) fn text(&self, name: &str) -> Result<Option<String>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(text)) if text.len() <= TEXT_BYTES_MAX => Ok(Some(text.clone())),
            Some(Value::String(_)) => Err(Error::InvalidRequest(format!(
                "`{name}` is longer than {TEXT_BYTES_MAX} bytes"
            ))),
            Some(_) => Err(Error::InvalidRequest(format!("`{name}` is a string"))),
        }
    }

    /// A text, or (W-6: a structured answer) an object or array as its JSON text.
    pub(crate) fn text_or_json(&self, name: &str) -> Result<Option<String>> {
        match self.get(name) {
            Some(value @ (Value::Object(_) | Value::Array(_))) => {
                let text = value.to_string();
                if text.len() > TEXT_BYTES_MAX {
                    return Err(Error::InvalidRequest(format!(
                        "`{name}` is longer than {TEXT_BYTES_MAX} bytes"
                    )));
                }
                Ok(Some(text))
            }
            _ => self.text(name),
        }
    }

    pub(crate) fn u64(&self, name: &str) -> Result<Option<u64>> {
        match self.get(name) {
            None => Ok(None),
            Some(value) => value.as_u64().map(Some).ok_or_else(|| {
                Error::InvalidRequest(format!("`{name}` is a non-negative integer"))
            }),
        }
    }

    pub(crate) fn parsed<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(text)) => text.parse().map(Some).map_err(|_| {
                Error::InvalidRequest(format!("`{name}` is not a valid id: `{text}`"))
            }),
            Some(_) => Err(Error::InvalidRequest(format!("`{name}` is an id string"))),
        }
    }
}
