//! K-7: an execution's own policy where recovery reads it: its restart window, when it has
//! one of its own (`PolicyRecord`, written with the transition that set it). Recovery lists
//! every such record once (`EventReader::policies`), never one read per execution.
//!
//! Stored by field order and variant index, like every record: never reorder.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::ExecutionId;

/// how long after an interruption an execution may still continue by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestartWindow {
    /// `-1`, the default: no time limit (a null deadline).
    #[default]
    Unlimited,
    /// `0`: no automatic restart.
    Disabled,
    /// A deadline this long after the shutdown intent or the last durable activity.
    Within(Duration),
}

impl RestartWindow {
    /// The deadline of an interruption at `since_ms` (the shutdown intent, or the abandoned
    /// attempt's last durable activity — never the next startup).
    pub fn deadline_from(self, since_ms: u64) -> Option<u64> {
        match self {
            RestartWindow::Unlimited => None,
            RestartWindow::Disabled => Some(since_ms),
            RestartWindow::Within(window) => {
                Some(since_ms.saturating_add(window.as_millis() as u64))
            }
        }
    }
}

/// Parses `-1`, `0`, or a duration: `90s`, `15m`, `2h`, `1d`, `500ms`, or plain seconds.
impl FromStr for RestartWindow {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        match text {
            "-1" => return Ok(RestartWindow::Unlimited),
            "0" => return Ok(RestartWindow::Disabled),
            _ => {}
        }
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let invalid =
            || format!("invalid restart window `{text}`: use -1, 0 or a duration like 90s, 2h");
        let number: u64 = number.parse().map_err(|_| invalid())?;
        let millis = match unit {
            "ms" => Some(number),
            "" | "s" => number.checked_mul(1_000),
            "m" => number.checked_mul(60_000),
            "h" => number.checked_mul(3_600_000),
            "d" => number.checked_mul(86_400_000),
            _ => None,
        }
        .ok_or_else(invalid)?;
        Ok(match millis {
            0 => RestartWindow::Disabled,
            millis => RestartWindow::Within(Duration::from_millis(millis)),
        })
    }
}

impl fmt::Display for RestartWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RestartWindow::Unlimited => f.write_str("-1"),
            RestartWindow::Disabled => f.write_str("0"),
            RestartWindow::Within(window) => {
                let ms = window.as_millis();
                match [
                    (86_400_000, "d"),
                    (3_600_000, "h"),
                    (60_000, "m"),
                    (1_000, "s"),
                ]
                .into_iter()
                .find(|(unit, _)| ms % unit == 0)
                {
                    Some((unit, name)) => write!(f, "{}{name}", ms / unit),
                    None => write!(f, "{ms}ms"),
                }
            }
        }
    }
}

/// How a restart window is stored: by variant index, in records and events.
#[derive(Serialize, Deserialize)]
enum Stored {
    Unlimited,
    Disabled,
    Within(Duration),
}

/// Stored by variant; read and written as its text (`-1`, `0`, `2h`) where people read it
/// (JSON: the event stream, projections).
impl Serialize for RestartWindow {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            return serializer.collect_str(self);
        }
        match *self {
            RestartWindow::Unlimited => Stored::Unlimited,
            RestartWindow::Disabled => Stored::Disabled,
            RestartWindow::Within(window) => Stored::Within(window),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RestartWindow {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let text = String::deserialize(deserializer)?;
            return text.parse().map_err(serde::de::Error::custom);
        }
        Ok(match Stored::deserialize(deserializer)? {
            Stored::Unlimited => RestartWindow::Unlimited,
            Stored::Disabled => RestartWindow::Disabled,
            Stored::Within(window) => RestartWindow::Within(window),
        })
    }
}

/// K-7: the restart window an execution has of its own, overriding the runtime's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRecord {
    pub execution_id: ExecutionId,
    pub restart_window: RestartWindow,
}

/// K-7: every execution's own restart window as recovery reads them, and the executions whose
/// record does not decode: recovery leaves those alone rather than guess their window.
#[derive(Debug, Default)]
pub struct Policies {
    pub windows: std::collections::HashMap<ExecutionId, RestartWindow>,
    pub damaged: Vec<(ExecutionId, String)>,
}

impl Policies {
    /// From records read by key; `execution_of` reads the execution id from a key.
    pub(crate) fn of(
        found: impl IntoIterator<Item = ([u8; 17], Result<RestartWindow, String>)>,
        execution_of: impl Fn(&[u8]) -> Option<ExecutionId>,
    ) -> Self {
        let mut policies = Policies::default();
        for (key, window) in found {
            let Some(execution_id) = execution_of(&key) else {
                continue; // no key of a policy record: nothing here to apply
            };
            match window {
                Ok(window) => {
                    policies.windows.insert(execution_id, window);
                }
                Err(error) => policies.damaged.push((execution_id, error)),
            }
        }
        policies
    }
}
