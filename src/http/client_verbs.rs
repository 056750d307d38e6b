//! The CLI's verbs for people (I-4): `send` starts a turn with a message (in a new session
//! when none is named) and can follow it to its end; `approve` and `deny` answer the
//! approval an execution waits for, naming that wait (never "whatever is pending", W-3);
//! and an execution named by its id alone, its session found by the server (`session_of`).

use serde_json::{json, Value};

use super::client::{Failure, Target};

/// How long `send --follow` waits for the turn to stop running.
const FOLLOW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// What `send` sends and how it answers.
#[derive(Debug, Clone, Copy)]
pub struct Sending<'a> {
    /// The session; `None`: a new one.
    pub session: Option<&'a str>,
    pub message: &'a str,
    /// The scripted model's decisions, as JSON text.
    pub script: Option<&'a str>,
    /// Wait until the turn no longer runs.
    pub follow: bool,
    pub shown: Shown,
}

/// How a verb prints what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// For people.
    Text,
    /// The server's replies as JSON.
    Json,
    /// The execution's id alone, for a script.
    Id,
}

/// `openprogram send [--session SID] MESSAGE`: admits a turn; with `follow`, polls it until
/// it no longer runs and prints its state and reply.
pub fn send(target: &Target, sending: Sending) -> Result<String, Failure> {
    let Sending {
        session,
        message,
        script,
        follow,
        shown,
    } = sending;
    let mut body = json!({"message": message});
    if let Some(script) = script {
        let script: Value = serde_json::from_str(script)
            .map_err(|error| Failure::Usage(format!("--script is not JSON: {error}")))?;
        body["script"] = script;
    }
    let (session, session_target) = match session {
        Some(session) => (session.to_owned(), target.clone()),
        None => {
            // A new session, made with the admin token; its own token then admits the turn.
            let created = target.call("POST", "/v1/sessions", None)?;
            let field = |name: &str| created[name].as_str().map(str::to_owned);
            let (Some(id), Some(token)) = (field("session_id"), field("token")) else {
                return Err(Failure::Failed(format!("no session in {created}")));
            };
            let url = target.url.clone();
            (id, Target { url, token })
        }
    };
    let path = format!("/v1/sessions/{session}/executions");
    let started = session_target.call("POST", &path, Some(&body))?;
    let execution = started["execution_id"].as_str().unwrap_or_default().to_owned();
    let ended = match follow {
        true => Some(followed(&session_target, &session, &execution)?),
        false => None,
    };
    // A turn that failed or was cancelled is a failure (its exit code says so).
    if let Some(snapshot) = &ended {
        said(snapshot)?;
    }
    match shown {
        Shown::Json => {
            let reply = json!({"session_id": session, "started": started, "snapshot": ended});
            return Ok(format!("{reply}\n"));
        }
        Shown::Id => return Ok(format!("{execution}\n")),
        Shown::Text => {}
    }
    let mut text = format!("session {session}\nexecution {execution}\n");
    if let Some(snapshot) = ended {
        text.push_str(&said(&snapshot)?);
    }
    Ok(text)
}

/// The snapshot once the execution no longer runs (it ended, or waits for someone).
fn followed(target: &Target, session: &str, execution: &str) -> Result<Value, Failure> {
    let path = format!("/v1/sessions/{session}/executions/{execution}");
    let deadline = std::time::Instant::now() + FOLLOW_TIMEOUT;
    loop {
        let snapshot = target.call("GET", &path, None)?;
        let state = snapshot["state"].as_str().unwrap_or_default();
        if !matches!(state, "queued" | "running" | "cancelling") {
            return Ok(snapshot);
        }
        if std::time::Instant::now() > deadline {
            return Err(Failure::Failed(format!(
                "{execution} still {state} after {} s",
                FOLLOW_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `openprogram approve|deny SESSION EXECUTION`: answers (or declines) the approval the
/// execution waits for, by its wait id read from the snapshot first. `scope`: what an
/// approval grants (`operation`, `tool`, `session`).
pub fn decide(
    target: &Target,
    session: &str,
    execution: &str,
    approve: bool,
    scope: Option<&str>,
    as_json: bool,
) -> Result<String, Failure> {
    let path = format!("/v1/sessions/{session}/executions/{execution}");
    let snapshot = target.call("GET", &path, None)?;
    let approvals: Vec<&Value> = (snapshot["waits"].as_array().into_iter().flatten())
        .filter(|wait| wait["status"] == "open")
        .filter(|wait| wait["kind"] == "approval" || wait["kind"] == "permission")
        .collect();
    let wait_id = match approvals.as_slice() {
        [one] => one["wait_id"].as_str().unwrap_or_default(),
        [] => {
            return Err(Failure::Failed(format!(
                "{execution} waits for no approval (it is {})",
                snapshot["state"].as_str().unwrap_or("unknown")
            )))
        }
        _ => {
            return Err(Failure::Failed(format!(
                "{execution} waits for {} approvals: answer one by its id (ctl answer --wait ID)",
                approvals.len()
            )))
        }
    };
    let command_id = uuid::Uuid::new_v4().to_string();
    let mut body = json!({"command_id": command_id, "wait_id": wait_id});
    if approve {
        body["kind"] = json!("answer");
        body["answer"] = json!("approved");
        body["scope"] = json!(scope.unwrap_or("operation"));
    } else {
        body["kind"] = json!("decline");
    }
    let reply = target.call("POST", &format!("{path}/commands"), Some(&body))?;
    if as_json {
        return Ok(format!("{reply}\n"));
    }
    let status = reply["status"].as_str().unwrap_or("unknown");
    if status == "rejected" {
        let reason = reply["reason"].as_str().unwrap_or_default();
        return Err(Failure::Failed(format!("{status}: {reason}")));
    }
    let verb = if approve { "approved" } else { "denied" };
    Ok(format!("{verb} {wait_id}\n"))
}

/// `--follow` after a verb: the execution's state once it no longer runs, as `send` says it;
/// a failure if it ended failed or cancelled.
pub fn followed_to_the_end(target: &Target, session: &str, execution: &str) -> Result<String, Failure> {
    let snapshot = followed(target, session, execution)?;
    said(&snapshot)
}

/// The state and reply of a snapshot that no longer runs; a failure if it failed or was
/// cancelled (a script can tell by the exit code).
fn said(snapshot: &Value) -> Result<String, Failure> {
    let state = snapshot["state"].as_str().unwrap_or("unknown");
    let reply = snapshot["text"].as_str().unwrap_or_default();
    match state {
        "failed" | "cancelled" => Err(Failure::Failed(format!("{state}: {reply}"))),
        _ => Ok(format!("{state}: {reply}\n")),
    }
}

/// The session of `execution`, found by the server across sessions (an admin's read).
pub fn session_of(target: &Target, execution: &str) -> Result<String, Failure> {
    use openprogram_storage::ExecutionId;
    let wanted: ExecutionId = execution
        .parse()
        .map_err(|_| Failure::Usage(format!("`{execution}` is not an execution id")))?;
    let path = format!("/debug/overview?id={wanted}&limit=5");
    let body = target.call("GET", &path, None)?;
    let rows = body["executions"].as_array().cloned().unwrap_or_default();
    rows.iter()
        .find(|row| {
            let id = row["execution_id"].as_str().and_then(|id| id.parse().ok());
            id == Some(wanted)
        })
        .and_then(|row| row["session_id"].as_str().map(str::to_owned))
        .ok_or_else(|| {
            Failure::Failed(format!(
                "no execution {execution} (naming it alone needs the admin token; else give SESSION EXECUTION)"
            ))
        })
}

/// SESSION and EXECUTION as the command line gave them: both, or the execution alone (its
/// session then found by the server).
pub fn session_and_execution(
    target: &Target,
    ids: &[String],
) -> Result<(String, String), Failure> {
    match ids {
        [session, execution] => Ok((session.clone(), execution.clone())),
        [execution] => Ok((session_of(target, execution)?, execution.clone())),
        _ => Err(Failure::Usage("name the execution: EXECUTION, or SESSION EXECUTION".into())),
    }
}
