//! Issue 36's CLI over many executions: `inspect executions --state S --kind K --since D
//! --text WORDS --limit N` (any session, needs attention first, each with what it was asked), `inspect tail` (the global log as it
//! grows) and `ctl KIND --where state=paused … [--dry-run]` (one command to every execution
//! selected, each fenced by the version it was listed at).

use std::io::Write as _;
use std::time::Duration;

use serde_json::Value;

use super::client::{cells, ctl, plain, table, Control, Failure, Target};

/// What selects executions: `key=value` pairs of `--where`, or `inspect`'s flags (their docs
/// its `--help`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Selection {
    /// executions, across sessions: only those in this state (waiting, paused, ...).
    #[arg(long)]
    pub state: Option<String>,
    /// executions: only this kind: agent, job or function.
    #[arg(long)]
    pub kind: Option<String>,
    #[arg(skip)]
    pub session: Option<String>,
    /// executions: only those admitted within this long (90s, 15m, 2h, 1d).
    #[arg(long)]
    pub since: Option<String>,
    /// executions: the one with this id (an execution's, a run's, a turn's or a message's).
    #[arg(long)]
    pub id: Option<String>,
    /// executions: only those whose message (or function and input) holds these words, in
    /// any case.
    #[arg(long)]
    pub text: Option<String>,
    /// executions: at most this many, those needing attention first (default 100).
    #[arg(long)]
    pub limit: Option<usize>,
}

impl Selection {
    /// `--where state=paused` etc.: each a key this selection has.
    pub fn from_wheres(wheres: &[String]) -> Result<Self, Failure> {
        let mut selection = Self::default();
        for clause in wheres {
            let (key, value) = clause.split_once('=').ok_or_else(|| {
                Failure::Usage(format!("--where `{clause}`: write it as key=value"))
            })?;
            let slot = match key.trim() {
                "state" => &mut selection.state,
                "kind" => &mut selection.kind,
                "session" => &mut selection.session,
                "since" => &mut selection.since,
                "id" => &mut selection.id,
                "text" => &mut selection.text,
                other => {
                    return Err(Failure::Usage(format!(
                        "--where `{other}`: select by state, kind, session, since, id or text"
                    )))
                }
            };
            *slot = Some(value.trim().to_owned());
        }
        Ok(selection)
    }

    /// The keys that select, with their values.
    fn keys(&self) -> [(&str, &Option<String>); 6] {
        [
            ("state", &self.state),
            ("kind", &self.kind),
            ("session", &self.session),
            ("since", &self.since),
            ("id", &self.id),
            ("text", &self.text),
        ]
    }

    /// Whether no key selects (`limit` aside).
    pub fn is_empty(&self) -> bool {
        self.keys().iter().all(|(_, value)| value.is_none())
    }

    /// `GET /debug/overview?…`, its values percent-encoded.
    fn path(&self) -> String {
        let mut query = Vec::new();
        for (key, value) in self.keys() {
            if let Some(value) = value {
                query.push(format!("{key}={}", encode(value)));
            }
        }
        if let Some(limit) = self.limit {
            query.push(format!("limit={limit}"));
        }
        format!("/debug/overview?{}", query.join("&"))
    }

    /// The executions selected, as the server lists them.
    fn rows(&self, target: &Target) -> Result<Vec<Value>, Failure> {
        let body = target.call("GET", &self.path(), None)?;
        Ok(body["executions"].as_array().cloned().unwrap_or_default())
    }
}

fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// `inspect executions` across sessions: needs attention first.
pub fn list(target: &Target, selection: &Selection, as_json: bool) -> Result<String, Failure> {
    let rows = selection.rows(target)?;
    if as_json {
        return Ok(format!("{}\n", Value::Array(rows)));
    }
    let lines = rows
        .iter()
        .map(|row| {
            let mut line = cells(row, &["execution_id", "session_id", "kind", "state"]);
            line.push(match row["needs_attention"].as_bool() {
                Some(true) => "needs attention".into(),
                _ => String::new(),
            });
            line.push(asked(row));
            line
        })
        .collect();
    Ok(table(
        &["EXECUTION", "SESSION", "KIND", "STATE", "ATTENTION", "ASKED"],
        lines,
    ))
}

/// What a row's execution was asked, its first 40 characters on one line.
fn asked(row: &Value) -> String {
    let request = row["request"].as_str().unwrap_or_default().replace('\n', " ");
    match request.char_indices().nth(40) {
        Some((end, _)) => format!("{}…", &request[..end]),
        None => request,
    }
}

/// `ctl KIND --where …`: the command to every execution selected (up to `--limit`, default and
/// at most 1,000; a selection that fills it says so), each with the version it was listed at as `expected_version`, so an execution that
/// moved meanwhile refuses it (`version_conflict`) instead of taking it blindly. With
/// `dry_run`, lists what it would touch and sends nothing. Fails (exit 1) if any was refused.
pub fn ctl_where(
    target: &Target,
    control: &Control,
    selection: &Selection,
    dry_run: bool,
    as_json: bool,
) -> Result<String, Failure> {
    if selection.is_empty() {
        return Err(Failure::Usage(
            "--where needs at least one of state, kind, session, since, id, text".into(),
        ));
    }
    if control.command_id.is_some() || control.expected_version.is_some() {
        return Err(Failure::Usage(
            "--where sends one command per execution: it takes no --command-id or --expected-version".into(),
        ));
    }
    let rows = selection.rows(target)?;
    let mut out = String::new();
    let mut refused = 0;
    for row in &rows {
        let (Some(session), Some(execution), Some(version)) = (
            row["session_id"].as_str(),
            row["execution_id"].as_str(),
            row["version"].as_u64(),
        ) else {
            continue;
        };
        if dry_run {
            out.push_str(&format!(
                "would {} {execution} (session {session}, {}, version {version})\n",
                control.kind,
                row["state"].as_str().unwrap_or("?")
            ));
            continue;
        }
        let one = Control {
            session: session.to_owned(),
            execution: execution.to_owned(),
            expected_version: Some(version),
            ..control.clone()
        };
        match ctl(target, &one, as_json) {
            Ok(line) => {
                refused += usize::from(line.contains("rejected"));
                out.push_str(&line);
            }
            Err(Failure::Failed(message)) => {
                refused += 1;
                out.push_str(&format!("{execution}: {message}\n"));
            }
            Err(usage) => return Err(usage),
        }
    }
    if selection.limit.is_some_and(|limit| rows.len() >= limit) {
        out.push_str(&format!(
            "the selection stopped at {} executions: narrow it, or raise --limit (at most 1,000)\n",
            rows.len()
        ));
    }
    match (dry_run, refused) {
        (true, _) => out.push_str(&format!(
            "{} executions selected; nothing sent\n",
            rows.len()
        )),
        (false, 0) => {}
        (false, refused) => {
            return Err(Failure::Failed(format!(
                "{out}{refused} of {} executions refused the command",
                rows.len()
            )))
        }
    }
    Ok(out)
}

/// `inspect tail`: the global log from `after` (0: its start; default: its end), one line
/// per event, following it until interrupted. Reads a page every `poll`.
pub fn tail(target: &Target, after: Option<u64>, as_json: bool) -> Result<String, Failure> {
    let mut cursor = after.map_or_else(|| last_position(target), Ok)?;
    let poll = Duration::from_millis(250);
    let stdout = std::io::stdout();
    loop {
        let events = target.call("GET", &format!("/debug/log?after={cursor}"), None)?;
        let events = events.as_array().cloned().unwrap_or_default();
        let mut out = stdout.lock();
        for event in &events {
            cursor = event["position"].as_u64().unwrap_or(cursor).max(cursor);
            let line = match as_json {
                true => format!("{event}\n"),
                false => format!(
                    "{} {} {} {}\n",
                    event["position"],
                    plain(&event["execution_id"]),
                    plain(&event["seq"]),
                    plain(&event["type"])
                ),
            };
            // A closed pipe (`| head`) ends the tail.
            if out
                .write_all(line.as_bytes())
                .and_then(|()| out.flush())
                .is_err()
            {
                return Ok(String::new());
            }
        }
        drop(out);
        if events.is_empty() {
            std::thread::sleep(poll);
        }
    }
}

/// The newest position of the global log now, read page by page to its end.
fn last_position(target: &Target) -> Result<u64, Failure> {
    let mut cursor = 0;
    loop {
        let events = target.call("GET", &format!("/debug/log?after={cursor}"), None)?;
        let Some(last) = events.as_array().and_then(|events| events.last()) else {
            return Ok(cursor);
        };
        cursor = last["position"].as_u64().unwrap_or(cursor).max(cursor + 1);
    }
}
