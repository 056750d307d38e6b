//! The client side of `openprogram ctl` and `inspect` (I-4): blocking HTTP calls with
//! `ureq`, readable tables by default, `--json` for machines. Every failure is one line
//! for stderr; `Failure::Usage` maps to exit code 2, everything else to 1.

use serde_json::{json, Value};

/// Why a command did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The command line was wrong (exit 2).
    Usage(String),
    /// The operation failed: the server refused it or could not be reached (exit 1).
    Failed(String),
}

/// How to reach the server.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub token: String,
}

impl Target {
    /// A JSON call: the answer's body, or the error the server named.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, Failure> {
        let text = self.text(method, path, body)?;
        serde_json::from_str(&text)
            .map_err(|error| Failure::Failed(format!("the answer is not JSON: {error}")))
    }

    /// A call whose answer is text (`/metrics`).
    pub(crate) fn text(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<String, Failure> {
        self.send(method, path, body, std::time::Duration::from_secs(60))?
            .into_string()
            .map_err(|error| Failure::Failed(format!("reading the answer: {error}")))
    }

    /// A `GET` whose body is read as it arrives (an event stream), for up to `timeout`.
    pub(crate) fn stream(
        &self,
        path: &str,
        timeout: std::time::Duration,
    ) -> Result<impl std::io::Read + Send, Failure> {
        Ok(self.send("GET", path, None, timeout)?.into_reader())
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        timeout: std::time::Duration,
    ) -> Result<ureq::Response, Failure> {
        let url = format!("{}{}", self.url.trim_end_matches('/'), path);
        let request = ureq::request(method, &url)
            .set("Authorization", &format!("Bearer {}", self.token))
            .timeout(timeout);
        let response = match body {
            Some(body) => request
                .set("Content-Type", "application/json")
                .send_string(&body.to_string()),
            None => request.call(),
        };
        match response {
            Ok(response) => Ok(response),
            Err(ureq::Error::Status(status, response)) => {
                let text = response.into_string().unwrap_or_default();
                let message = match serde_json::from_str::<Value>(&text) {
                    Ok(body) => format!(
                        "{} ({status}): {}",
                        body["code"].as_str().unwrap_or("error"),
                        body["message"].as_str().unwrap_or("")
                    ),
                    Err(_) => format!("HTTP {status}"),
                };
                Err(Failure::Failed(message))
            }
            Err(error) => Err(Failure::Failed(format!("cannot reach {url}: {error}"))),
        }
    }
}

/// A control for `ctl`, with the fields SPEC §6 gives it; its flags are `ctl`'s (their docs
/// its `--help`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Control {
    /// The command kind as the API spells it (`stop_process`).
    #[arg(skip)]
    pub kind: String,
    #[arg(skip)]
    pub session: String,
    #[arg(skip)]
    pub execution: String,
    /// steer: the instructions; reconcile: the confirmed output.
    #[arg(long)]
    pub text: Option<String>,
    /// answer, decline: the wait (required unless --expected-version pins the pending
    /// one).
    #[arg(long)]
    pub wait: Option<String>,
    /// A UUID; the same id again returns the stored outcome. Default: a new one.
    #[arg(long)]
    pub command_id: Option<String>,
    /// The execution's version you acted on: refused (version_conflict) if it moved on.
    #[arg(long)]
    pub expected_version: Option<u64>,
    /// answer: the answer text.
    #[arg(long)]
    pub answer: Option<String>,
    /// answer: `operation` (default), `tool`, `session` or `discussion`; a
    /// structured answer is its JSON (`--answer '{"env": "prod"}'`).
    #[arg(long)]
    pub scope: Option<String>,
    /// revoke: the approval that gave the grant (`wait_…`).
    #[arg(long)]
    pub grant: Option<String>,
    /// stop-process: the process id.
    #[arg(long)]
    pub process: Option<String>,
    /// reconcile: `confirmed` or `not_applied`.
    #[arg(long)]
    pub outcome: Option<String>,
    /// fork: the checkpoint seq to fork from (default: the latest saved point).
    #[arg(long)]
    pub checkpoint: Option<u64>,
    /// set-policy: `keep_original` or `use_latest` (durable functions).
    #[arg(long)]
    pub policy: Option<String>,
    /// set-policy: how long after an interruption this execution may still continue by
    /// itself: -1 (no limit), 0 (never) or a duration like 2h.
    #[arg(long, allow_hyphen_values = true)]
    pub restart_window: Option<String>,
}

/// `openprogram ctl`: sends the command, prints its reply. A refused command fails. The
/// flags become the command's body and are read back by the runtime's own parser
/// (`Command::from_json`) before anything is sent: a flag the kind does not take, or one it
/// lacks, is a usage error here exactly as it would be a 400 there.
pub fn ctl(target: &Target, control: &Control, as_json: bool) -> Result<String, Failure> {
    let command_id = control
        .command_id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let mut body = json!({"command_id": command_id, "kind": control.kind});
    let fields = [
        ("text", json!(control.text)),
        ("wait_id", json!(control.wait)),
        ("expected_version", json!(control.expected_version)),
        ("answer", json!(control.answer)),
        ("scope", json!(control.scope)),
        ("grant_id", json!(control.grant)),
        ("process_id", json!(control.process)),
        ("outcome", json!(control.outcome)),
        ("checkpoint", json!(control.checkpoint)),
        ("policy", json!(control.policy)),
        ("restart_window", json!(control.restart_window)),
    ];
    for (name, value) in &fields {
        if !value.is_null() {
            body[*name] = value.clone();
        }
    }
    let command = openprogram_actors::command::Command::from_json(&body).map_err(|error| {
        // The body's field names, as this command's flags.
        let flag = |field: &str| match field {
            "wait_id" => "--wait".to_owned(),
            "process_id" => "--process".to_owned(),
            "grant_id" => "--grant".to_owned(),
            other => format!("--{}", other.replace('_', "-")),
        };
        match &error {
            openprogram_actors::Error::UnknownField { field, .. } => Failure::Usage(format!(
                "{} does not take {}",
                control.kind.replace('_', "-"),
                flag(field)
            )),
            _ => {
                let mut message = format!("{} ({})", error, error.code());
                for field in fields.iter().map(|(field, _)| *field).chain(["command_id"]) {
                    message = message.replace(&format!("`{field}`"), &format!("`{}`", flag(field)));
                }
                Failure::Usage(message)
            }
        }
    })?;
    let body = command.to_json();
    let path = format!(
        "/v1/sessions/{}/executions/{}/commands",
        control.session, control.execution
    );
    let reply = target.call("POST", &path, Some(&body))?;
    if as_json {
        return Ok(format!("{reply}\n"));
    }
    let child = match reply["execution_id"].as_str() {
        Some(child) => format!(", child execution {child}"),
        None => String::new(),
    };
    Ok(format!(
        "{} {} (command {}, version {}{child})\n",
        control.kind,
        reply["status"].as_str().unwrap_or("?"),
        reply["command_id"].as_str().unwrap_or("?"),
        reply["version"]
    ))
}

/// `openprogram call`: starts a durable function's execution (F-1), prints its ids.
pub fn call(
    target: &Target,
    session: &str,
    function: &str,
    input: &str,
    policy: Option<&str>,
    as_json: bool,
) -> Result<String, Failure> {
    let input: Value = serde_json::from_str(input)
        .map_err(|error| Failure::Usage(format!("--input is not JSON: {error}")))?;
    let mut body = json!({"kind": "function", "function": function, "input": input});
    if let Some(policy) = policy {
        body["policy"] = json!(policy);
    }
    let reply = target.call(
        "POST",
        &format!("/v1/sessions/{session}/executions"),
        Some(&body),
    )?;
    if as_json {
        return Ok(format!("{reply}\n"));
    }
    Ok(format!(
        "{function} revision {} started: execution {} (run {})\n",
        reply["function_revision"],
        reply["execution_id"].as_str().unwrap_or("?"),
        reply["run_id"].as_str().unwrap_or("?"),
    ))
}

/// `openprogram inspect WHAT [IDS]`: the answer of the read WHAT names, as JSON or a table.
pub fn inspect(
    target: &Target,
    what: &str,
    ids: &[String],
    after: u64,
    as_json: bool,
) -> Result<String, Failure> {
    let need = |count: usize, usage: &str| match ids.len() < count {
        true => Err(Failure::Usage(format!("inspect {what} needs {usage}"))),
        false => Ok(()),
    };
    let path = match what {
        "sessions" => "/debug/executions".to_owned(),
        "executions" if !ids.is_empty() => format!("/v1/sessions/{}/executions", ids[0]),
        "activity" => {
            need(1, "SESSION")?;
            format!("/v1/sessions/{}/activity", ids[0])
        }
        "execution" | "events" => {
            need(2, "SESSION EXECUTION")?;
            let path = format!("/v1/sessions/{}/executions/{}", ids[0], ids[1]);
            match what {
                "events" => format!("{path}/events?after={after}"),
                _ => path,
            }
        }
        "actors" => match ids.first() {
            Some(id) => format!("/debug/actors/{id}"),
            None => "/debug/actors".into(),
        },
        "resources" => "/v1/resources".to_owned(),
        other => return Err(Failure::Usage(format!(
            "unknown inspect target `{other}`: sessions, executions, execution, events, activity, actors or resources"
        ))),
    };
    let mut body = target.call("GET", &path, None)?;
    if what == "sessions" {
        body = Value::Array(body["sessions"].as_array().cloned().unwrap_or_default());
    }
    if as_json {
        return Ok(format!("{body}\n"));
    }
    let rows = match &body {
        Value::Array(rows) => rows.clone(),
        // One actor, asked by its id.
        one if what == "actors" => vec![one.clone()],
        _ => Vec::new(),
    };
    let listed = |headers: &[&str], columns: &[&str]| {
        table(
            headers,
            rows.iter().map(|row| cells(row, columns)).collect(),
        )
    };
    Ok(match what {
        "sessions" => listed(&["SESSION", "EXECUTIONS"], &["session_id", "executions"]),
        "executions" => listed(
            &["EXECUTION", "STATE", "VERSION", "TEXT"],
            &["execution_id", "state", "version", "text"],
        ),
        "events" => listed(
            &["SEQ", "POSITION", "AT_MS", "TYPE"],
            &["seq", "position", "at_ms", "type"],
        ),
        "actors" => listed(
            &["KIND", "ID", "HANDLED", "STATE"],
            &["kind", "id", "handled", "state"],
        ),
        "activity" => activity(&body),
        "resources" => resources(&rows),
        _ => describe(&body),
    })
}

/// A session's Activity: its branches, section by section.
fn activity(activity: &Value) -> String {
    let mut rows = Vec::new();
    for section in ["needs_attention", "in_progress", "history"] {
        for row in activity[section].as_array().into_iter().flatten() {
            let mut line = vec![section.to_owned()];
            line.extend(cells(row, &["heading", "executions", "child_tasks", "status", "label"]));
            rows.push(line);
        }
    }
    table(
        &["SECTION", "BRANCH", "EXECUTIONS", "CHILD TASKS", "STATUS", "LABEL"],
        rows,
    )
}

/// The resource queue: each resource with the first Jobs waiting for it.
fn resources(resources: &[Value]) -> String {
    let mut rows = Vec::new();
    for resource in resources {
        let mut row = cells(resource, &["name", "capacity", "in_use", "queued"]);
        let waiting: Vec<String> = resource["waiting"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|job| job.as_str().map(str::to_owned))
            .collect();
        row.push(match waiting.len() {
            0 => "-".to_owned(),
            1..=3 => waiting.join(" "),
            more => format!("{} … ({more} in all)", waiting[..3].join(" ")),
        });
        rows.push(row);
    }
    table(
        &["RESOURCE", "CAPACITY", "IN_USE", "QUEUED", "NEXT IN LINE"],
        rows,
    )
}

/// A snapshot in a few readable lines.
fn describe(snapshot: &Value) -> String {
    let mut text = String::new();
    for field in ["execution_id", "session_id"] {
        text.push_str(&format!("{field:<14} {}\n", plain(&snapshot[field])));
    }
    let state = super::client_words::state_in_words(snapshot);
    text.push_str(&format!("{:<14} {state}\n", "state"));
    for field in ["version", "attempt"] {
        text.push_str(&format!("{field:<14} {}\n", plain(&snapshot[field])));
    }
    // As `ctl` takes them.
    let controls: Vec<String> = (snapshot["capabilities"].as_array().into_iter().flatten())
        .map(|kind| super::client_words::control_word(&plain(kind)))
        .collect();
    text.push_str(&format!("{:<14} {}\n", "controls", controls.join(", ")));
    text.push_str(&format!("{:<14} {}\n", "text", plain(&snapshot["text"])));
    for (key, columns) in [
        ("receipts", &["effect_id", "tool", "status"][..]),
        ("waits", &["wait_id", "kind", "status", "prompt"][..]),
        (
            "processes",
            &["process_id", "state", "exit_code", "output_bytes"][..],
        ),
    ] {
        let rows: Vec<Vec<String>> = snapshot[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|row| cells(row, columns))
            .collect();
        if !rows.is_empty() {
            let headers: Vec<String> = columns.iter().map(|c| c.to_uppercase()).collect();
            let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
            text.push_str(&format!("\n{key}:\n{}", table(&headers, rows)));
        }
    }
    text
}

pub(crate) fn plain(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

pub(crate) fn cells(row: &Value, columns: &[&str]) -> Vec<String> {
    columns.iter().map(|column| plain(&row[*column])).collect()
}

/// Columns padded to their widest cell.
pub(crate) fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|header| header.len()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut text = line(headers.iter().map(|header| header.to_string()).collect());
    for row in rows {
        text.push_str(&line(row));
    }
    text
}
