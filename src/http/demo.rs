//! What `serve --demo` seeds through the library, so the page has something to show: a completed
//! turn and a fork of it (a second branch, paused), a turn waiting for approval, a turn that left a
//! managed process running (`sleep 3600`), and durable functions: a completed run of `steps`, and
//! one paused on a version conflict (started on revision 1, one step done, then moved to
//! `use_latest` with revision 3 deployed, which accounts for none of its steps).
//!
//! Seeded once, into an empty store, and recorded in `DIR/demo.json` (mode 0600: it holds the
//! sessions' tokens), which a later `--demo` start reads instead; other content is never
//! seeded over. The process runs until stopped (the page's Stop, or `ctl stop-process`); if
//! `serve` stops first it outlives it, and the next start records it `lost` and never signals
//! it (P-3): end it with `kill` and the pid `/debug/actors` showed.

use std::path::Path;

use openprogram_storage::{ExecutionId, SessionId};
use serde_json::{json, Value};

use super::auth::{self, Tokens};
use crate::{Error, FunctionStart, Result, Runtime, StartRequest};

/// Seeds the demo unless it was seeded before (then returns what was) or the store holds
/// other work (then `None`).
pub async fn seed_once(runtime: &Runtime, tokens: &Tokens, dir: &Path) -> Result<Option<Value>> {
    let marker = dir.join("demo.json");
    match std::fs::read_to_string(&marker) {
        Ok(text) => {
            return serde_json::from_str(&text).map(Some).map_err(|error| {
                Error::InvalidRequest(format!("{} is not JSON: {error}", marker.display()))
            })
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(Error::Unavailable(format!("{}: {error}", marker.display()))),
    }
    if !runtime.store().log_after(0, 1)?.is_empty() {
        return Ok(None);
    }
    let approved_file = dir.join("demo-approved.txt");
    let first = SessionId::new();
    let completed = start(
        runtime,
        first,
        "Say hello",
        json!([
            {"tool": "echo", "args": {"text": "hello"}},
            {"reply": "Hello from the demo: one echo call, then this reply."}
        ]),
    )
    .await?;
    runtime.wait_finished(first, completed).await?;
    // An alternative reply from the saved point before the reply: a second branch.
    let fork = crate::Command::new(crate::CommandBody::Fork { checkpoint: None });
    let forked = runtime.command(first, completed, fork).await?;
    let forked = forked.execution_id.ok_or_else(|| {
        Error::Internal(format!("the demo's fork was not made: {:?}", forked.reason))
    })?;
    let waiting = start(
        runtime,
        first,
        "Append a line to a file, with approval",
        json!([
            {"ask": "May I append a line to demo-approved.txt?"},
            {"tool": "append", "args": {"path": approved_file.display().to_string(), "line": "approved in the demo"}},
            {"reply": "Appended the line."}
        ]),
    )
    .await?;
    let second = SessionId::new();
    let process = start(
        runtime,
        second,
        "Run a long background job",
        json!([
            {"tool": "shell", "args": {"program": "sleep", "args": ["3600"], "background": true}},
            {"reply": "Started `sleep 3600` in the background; stop it with its Stop control."}
        ]),
    )
    .await?;
    let third = SessionId::new();
    let (function_run, conflict) = seed_functions(runtime, third, dir).await?;
    let session = |session_id, label: &str, executions: &[ExecutionId]| {
        let token = tokens.session_token(session_id);
        json!({"session_id": session_id, "token": token, "label": label, "executions": executions})
    };
    let seeded = json!({ "sessions": [
        session(first, "demo: a completed turn, a fork of it, and a turn waiting for approval",
            &[completed, forked, waiting]),
        session(second, "demo: a turn that left a managed process running", &[process]),
        session(third, "demo: durable functions, one completed, one paused on a version conflict",
            &[function_run, conflict]),
    ]});
    auth::write_secret(&marker, &seeded.to_string())
        .map_err(|error| Error::Unavailable(format!("{}: {error}", marker.display())))?;
    eprintln!(
        "openprogram: --demo seeded sessions {first}, {second} and {third} (tokens in {})",
        marker.display()
    );
    Ok(Some(seeded))
}

async fn start(
    runtime: &Runtime,
    session: SessionId,
    message: &str,
    script: Value,
) -> Result<ExecutionId> {
    let script = match script {
        Value::Array(steps) => steps.into_iter().map(Into::into).collect(),
        other => vec![other.into()],
    };
    let request = StartRequest {
        message: message.into(),
        script,
        ..Default::default()
    };
    Ok(runtime
        .start_execution(session, request)
        .await?
        .execution_id)
}

/// A completed `steps` run, and one paused `version_conflict`: started on revision 1 with
/// an approval before its second step, moved to `use_latest` while it waits, then approved.
async fn seed_functions(
    runtime: &Runtime,
    session: SessionId,
    dir: &Path,
) -> Result<(ExecutionId, ExecutionId)> {
    let steps = |file: &str, ask_at: Option<u32>| {
        let path = dir.join(file).display().to_string();
        json!({"count": 3, "path": path, "ask_at": ask_at})
    };
    let start = |input: Value, revision: Option<u32>| async move {
        let function = "steps".into();
        let start = FunctionStart {
            function,
            input,
            revision,
            ..Default::default()
        };
        let started = runtime.start_function(session, start).await?;
        Ok::<_, Error>(started.started.execution_id)
    };
    let completed = start(steps("demo-steps.txt", None), None).await?;
    runtime.wait_finished(session, completed).await?;
    let conflict = start(steps("demo-conflict.txt", Some(2)), Some(1)).await?;
    until(runtime, session, conflict, |snapshot| {
        snapshot.state == "waiting"
    })
    .await?;
    for body in [
        crate::CommandBody::SetPolicy {
            policy: Some(crate::VersionPolicy::UseLatest),
            restart_window: None,
        },
        crate::CommandBody::Answer {
            wait: crate::WaitRef::Pending,
            answer: "yes".into(),
            scope: openprogram_storage::AnswerScope::Operation,
        },
    ] {
        let version = runtime.snapshot(session, conflict).await?.version;
        let command = crate::Command::new(body).expecting(version);
        runtime.command(session, conflict, command).await?;
    }
    until(runtime, session, conflict, |snapshot| {
        snapshot.pause_reason.as_deref() == Some("version_conflict")
    })
    .await?;
    Ok((completed, conflict))
}

/// Waits (up to a minute) until the execution's snapshot satisfies `done`.
async fn until(
    runtime: &Runtime,
    session: SessionId,
    execution: ExecutionId,
    done: impl Fn(&crate::Snapshot) -> bool,
) -> Result<()> {
    for _ in 0..6000 {
        if done(&runtime.snapshot(session, execution).await?) {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Err(Error::Internal(
        "the demo's function did not reach its state within a minute".into(),
    ))
}
