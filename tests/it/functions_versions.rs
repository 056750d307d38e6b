//! Durable functions' versions and identity (F-3, F-7, K-7): keep_original and use_latest
//! across new deployments, step correspondence and state conversion, version conflicts,
//! `set_policy` and a policy on Continue, identities from code.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use openprogram::agent::Recovery;
use openprogram::storage::Event;
use openprogram::{DurableFunction, FunctionStart, Runtime};
use serde_json::json;

use crate::functions::*;
use crate::support::*;

#[test]
fn f7_other_code_under_a_registered_name_and_revision_is_refused_before_anything_runs() {
    let runs = Arc::new(AtomicU32::new(0));
    let dir = tempfile::tempdir().expect("tempdir");
    let refused = Runtime::builder()
        .data_dir(dir.path())
        .function(counting(Arc::clone(&runs), "counting:v1"))
        .function(counting(Arc::clone(&runs), "counting:v1-edited"))
        .open()
        .expect_err("two bodies under one revision");
    assert_eq!(refused.code(), "invalid_request");
    assert!(
        refused.to_string().contains("another identity"),
        "{refused}"
    );
    // The same code twice is one registration.
    let same = Runtime::builder()
        .data_dir(dir.path())
        .function(counting(Arc::clone(&runs), "counting:v1"))
        .function(counting(Arc::clone(&runs), "counting:v1"))
        .open()
        .expect("the same identity twice");
    same.halt();
    // A built-in's name and revision cannot be taken by other code either.
    let builtin = Runtime::builder()
        .data_dir(dir.path())
        .function(DurableFunction::with_identity(
            "steps",
            1,
            "mine",
            |_, _| async { Ok(json!(null)) },
        ))
        .open()
        .expect_err("other code as steps revision 1");
    assert_eq!(builtin.code(), "invalid_request");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn f3_keep_original_continues_on_revision_1_across_a_restart_with_revisions_1_to_3() {
    let restarts = Restarts::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let (execution, _) =
        interrupted_steps(&restarts, &path, openprogram::VersionPolicy::KeepOriginal).await;
    // New code deployed: revisions 2 and 3 beside 1.
    let runtime = open_steps(&restarts, &[1, 2, 3]);
    let snapshot = wait_function(&runtime, &restarts, execution, "completed", |snapshot| {
        snapshot.state == "completed"
    })
    .await;
    assert_each_step_once(&path, 6);
    let function = snapshot.function.expect("function");
    assert_eq!((function.revision, function.policy), (1, "keep_original"));
    runtime.halt();
}

#[tokio::test]
async fn f3_use_latest_1_to_2_runs_summary_once_and_keeps_the_steps_of_revision_1() {
    let restarts = Restarts::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let (execution, done) =
        interrupted_steps(&restarts, &path, openprogram::VersionPolicy::UseLatest).await;
    let runtime = open_steps(&restarts, &[1, 2]);
    let snapshot = wait_function(&runtime, &restarts, execution, "completed", |snapshot| {
        snapshot.state == "completed"
    })
    .await;
    let appended: Vec<String> = lines(&path).into_iter().map(|(step, _)| step).collect();
    let mut expected: Vec<String> = (1..=6).map(|index| format!("s{index}")).collect();
    expected.push("summary".into());
    assert_eq!(appended, expected, "each step once, then the summary once");
    let function = snapshot.function.expect("function");
    assert_eq!((function.revision, function.policy), (2, "use_latest"));
    // The steps committed before the switch keep their provenance (F-3).
    let provenance: Vec<(String, u32)> = function
        .completed_steps
        .iter()
        .map(|step| (step.step_id.clone(), step.revision))
        .collect();
    for (index, (step, revision)) in provenance.iter().enumerate() {
        let expected = if index < done { 1 } else { 2 };
        assert_eq!(*revision, expected, "{step}: {provenance:?}");
    }
    // Adopted before any step of revision 2 ran (F-7).
    let events = runtime
        .events(restarts.session, execution, 0)
        .expect("events");
    let adopted = events
        .iter()
        .position(|envelope| matches!(envelope.event, Event::RevisionAdopted { revision: 2, .. }))
        .expect("the adoption");
    let last_of_revision_1 = events
        .iter()
        .filter(|envelope| matches!(envelope.event, Event::StepFinished { .. }))
        .nth(done - 1)
        .map(|envelope| envelope.seq)
        .expect("the last step of revision 1");
    assert!(events[adopted].seq > last_of_revision_1);
    let first_of_revision_2 = events
        .iter()
        .filter(|envelope| matches!(envelope.event, Event::StepStarted { .. }))
        .nth(done)
        .map(|envelope| envelope.seq)
        .expect("a step of revision 2");
    assert!(events[adopted].seq < first_of_revision_2);
    runtime.halt();
}

#[tokio::test]
async fn f3_use_latest_1_to_3_pauses_with_the_differences_and_runs_nothing() {
    let restarts = Restarts::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let (execution, done) =
        interrupted_steps(&restarts, &path, openprogram::VersionPolicy::UseLatest).await;
    let runtime = open_steps(&restarts, &[1, 3]);
    let snapshot = wait_function(&runtime, &restarts, execution, "version_conflict", |s| {
        s.pause_reason.as_deref() == Some("version_conflict")
    })
    .await;
    assert_eq!(snapshot.state, "paused");
    assert_eq!(lines(&path).len(), done, "nothing ran");
    let function = snapshot.function.expect("function");
    assert_eq!(function.revision, 1, "never switched");
    assert!(
        function.differences[0].contains("declares no step correspondence with revision 1"),
        "{:?}",
        function.differences
    );
    assert_eq!(
        function.differences.len(),
        done + 1,
        "{:?}",
        function.differences
    );
    assert!(function.differences[1].contains("step `s1` completed in revision 1"));
    // K-7: the operator keeps the original code; the policy change alone starts nothing.
    let command = |kind: &str, extra: serde_json::Value| {
        let mut body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": kind});
        if let (Some(body), serde_json::Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        openprogram::Command::from_json(&body).expect("a command")
    };
    let stale = runtime
        .command(
            restarts.session,
            execution,
            command(
                "set_policy",
                json!({"policy": "keep_original", "expected_version": 1}),
            ),
        )
        .await
        .expect("set_policy");
    assert_eq!(
        (stale.status, stale.code.as_deref()),
        ("rejected", Some("version_conflict"))
    );
    let kept = runtime
        .command(
            restarts.session,
            execution,
            command("set_policy", json!({"policy": "keep_original"})),
        )
        .await
        .expect("set_policy");
    assert_eq!(kept.status, "applied", "{kept:?}");
    let after = runtime
        .snapshot(restarts.session, execution)
        .await
        .expect("snapshot");
    assert_eq!(after.state, "paused", "a policy change starts nothing");
    assert_eq!(after.function.expect("function").policy, "keep_original");
    let resumed = runtime
        .command(restarts.session, execution, command("continue", json!({})))
        .await
        .expect("continue");
    assert_eq!(resumed.status, "applied", "{resumed:?}");
    wait_function(&runtime, &restarts, execution, "completed", |snapshot| {
        snapshot.state == "completed"
    })
    .await;
    assert_each_step_once(&path, 6);
    runtime.halt();
}

#[tokio::test]
async fn f3_its_revision_unregistered_a_keep_original_execution_pauses_revision_missing() {
    let restarts = Restarts::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let (execution, done) =
        interrupted_steps(&restarts, &path, openprogram::VersionPolicy::KeepOriginal).await;
    let runtime = open_steps(&restarts, &[2, 3]);
    let snapshot = wait_function(&runtime, &restarts, execution, "revision_missing", |s| {
        s.pause_reason.as_deref() == Some("revision_missing")
    })
    .await;
    assert_eq!(snapshot.state, "paused");
    assert_eq!(lines(&path).len(), done, "no other code ran");
    assert_eq!(snapshot.function.expect("function").revision, 1);
    runtime.halt();
}

#[tokio::test]
async fn k7_set_policy_is_a_functions_command() {
    let harness = steps_harness();
    // An agent offers set_policy (its restart window) while it can still run; a version
    // policy is still a function's.
    let agent = harness.start_paused(vec![reply("hi")]).await;
    let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "set_policy", "policy": "use_latest"});
    let refused = harness.send(agent, body).await;
    assert_eq!(refused.status, "rejected");
    assert_eq!(
        refused.code.as_deref(),
        Some("functions_only"),
        "{refused:?}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let started = harness
        .runtime
        .start_function(
            harness.session,
            FunctionStart {
                function: "steps".into(),
                input: json!({"count": 2, "path": path}),
                start_paused: true,
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let execution = started.started.execution_id;
    let snapshot = harness.snapshot(execution).await;
    assert!(
        snapshot.capabilities.contains(&"set_policy"),
        "{:?}",
        snapshot.capabilities
    );
    let bad = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "set_policy", "policy": "newest"});
    let error = openprogram::Command::from_json(&bad).expect_err("not a policy");
    assert_eq!(error.code(), "invalid_request");
    let completed = harness.command(execution, "continue", None).await;
    assert_eq!(completed.status, "applied");
    let done = harness.wait_for_state(execution, "completed").await;
    assert!(
        !done.capabilities.contains(&"set_policy"),
        "{:?}",
        done.capabilities
    );
    assert_each_step_once(&path, 2);
}

/// F-3: a nested call of a revision that is not registered pauses `revision_missing`.
#[tokio::test]
async fn f3_a_nested_call_of_an_unregistered_revision_pauses_revision_missing() {
    let harness = steps_harness_with(&[("steps", 2), ("nested", 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nested.log");
    let started = harness
        .runtime
        .start_function(
            harness.session,
            FunctionStart {
                function: "nested".into(),
                input: json!({"count": 2, "path": path}),
                ..Default::default()
            },
        )
        .await
        .expect("start nested");
    let snapshot = harness
        .wait_for(started.started.execution_id, "revision_missing", |s| {
            s.pause_reason.as_deref() == Some("revision_missing")
        })
        .await;
    assert_eq!(snapshot.state, "paused");
    assert!(lines(&path).is_empty(), "no other code ran");
}

// F-7: identities from code, with `#[durable_function]` and `#[durable_helper]`.
#[openprogram::durable_helper]
fn double(x: u64) -> u64 {
    x * 2
}

#[openprogram::durable_helper]
fn triple(x: u64) -> u64 {
    x * 3
}

mod identity_a {
    use openprogram::FunctionContext;
    use serde_json::{json, Value};

    #[openprogram::durable_function(name = "ident", revision = 1, helpers(super::double))]
    pub async fn ident(_context: FunctionContext, _input: Value) -> Result<Value, String> {
        Ok(json!(super::double(2)))
    }
}

mod identity_same_code {
    use openprogram::FunctionContext;
    use serde_json::{json, Value};

    /// The same code as `identity_a`, written otherwise (a doc comment, other line
    /// breaks).
    #[openprogram::durable_function(name = "ident", revision = 1, helpers(super::double))]
    pub async fn ident(_context: FunctionContext, _input: Value) -> Result<Value, String> {
        Ok(json!(super::double(2)))
    }
}

mod identity_other_helper {
    use openprogram::FunctionContext;
    use serde_json::{json, Value};

    #[openprogram::durable_function(name = "ident", revision = 1, helpers(super::triple))]
    pub async fn ident(_context: FunctionContext, _input: Value) -> Result<Value, String> {
        Ok(json!(super::triple(2)))
    }
}

#[test]
fn f7_a_functions_identity_is_its_code_and_its_helpers_code() {
    let a = identity_a::ident_durable();
    let same = identity_same_code::ident_durable();
    let other = identity_other_helper::ident_durable();
    assert_eq!(
        a.identity, same.identity,
        "formatting and comments are not code"
    );
    assert_ne!(a.identity, other.identity, "another helper is other code");
    assert!(
        a.identity.contains('+'),
        "the helper's identity is part of it: {}",
        a.identity
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let refused = Runtime::builder()
        .data_dir(dir.path())
        .function(a.clone())
        .function(other)
        .open()
        .expect_err("other code under ident revision 1");
    assert_eq!(refused.code(), "invalid_request");
    let accepted = Runtime::builder()
        .data_dir(dir.path())
        .function(a)
        .function(same)
        .open()
        .expect("the same code twice");
    accepted.halt();
}

/// F-7: an execution started on a revision whose code has changed since (another identity
/// under the same name and revision) is never continued on that other code: it pauses
/// `revision_missing`.
#[tokio::test]
async fn f7_changed_code_under_the_same_revision_is_not_that_revision() {
    let restarts = Restarts::new();
    let runs = Arc::new(AtomicU32::new(0));
    let open = |identity: &str| {
        let function = counting(Arc::clone(&runs), identity);
        restarts.open_with(|builder| builder.function(function))
    };
    let runtime = open("counting:v1");
    let started = runtime
        .start_function(
            restarts.session,
            FunctionStart {
                function: "counting".into(),
                input: json!(2),
                start_paused: true,
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let execution = started.started.execution_id;
    runtime.halt();
    drop(runtime);
    let runtime = open("counting:v1-edited");
    let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "continue"});
    let reply = runtime
        .command(
            restarts.session,
            execution,
            openprogram::Command::from_json(&body).expect("command"),
        )
        .await
        .expect("continue");
    assert_eq!(reply.status, "applied", "{reply:?}");
    let snapshot = wait_function(&runtime, &restarts, execution, "revision_missing", |s| {
        s.pause_reason.as_deref() == Some("revision_missing")
    })
    .await;
    assert_eq!(snapshot.state, "paused");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the edited code never ran");
    runtime.halt();
}

/// K-7: a `policy` on Continue takes effect in the same transition: a version conflict is
/// resolved by continuing on the original code; an agent's Continue with a policy is refused.
#[tokio::test]
async fn k7_continue_with_a_policy_resolves_a_version_conflict_in_one_command() {
    let restarts = Restarts::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let (execution, _) =
        interrupted_steps(&restarts, &path, openprogram::VersionPolicy::UseLatest).await;
    let runtime = open_steps(&restarts, &[1, 3]);
    wait_function(&runtime, &restarts, execution, "version_conflict", |s| {
        s.pause_reason.as_deref() == Some("version_conflict")
    })
    .await;
    let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "continue",
        "policy": "keep_original"});
    let continued = runtime
        .command(
            restarts.session,
            execution,
            openprogram::Command::from_json(&body).expect("command"),
        )
        .await
        .expect("continue");
    assert_eq!(continued.status, "applied", "{continued:?}");
    let done = wait_function(&runtime, &restarts, execution, "completed", |s| {
        s.state == "completed"
    })
    .await;
    let function = done.function.expect("function");
    assert_eq!((function.revision, function.policy), (1, "keep_original"));
    assert_each_step_once(&path, 6);
    let agent = restarts.start_paused(&runtime, vec![reply("hi")]).await;
    let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "continue",
        "policy": "use_latest"});
    let refused = runtime
        .command(
            restarts.session,
            agent,
            openprogram::Command::from_json(&body).expect("command"),
        )
        .await
        .expect("continue");
    assert_eq!(
        (refused.status, refused.code.as_deref()),
        ("rejected", Some("functions_only"))
    );
    runtime.halt();
}

/// `shape` revision 1: a step `price` returning `{"cents": 500}`, then an approval, then its
/// result as the price.
fn shape_v1() -> DurableFunction {
    DurableFunction::with_identity("shape", 1, "shape:v1", |context, _| async move {
        let price: serde_json::Value = context
            .step("price", Recovery::Idempotent, |_| async {
                Ok(json!({"cents": 500}))
            })
            .await
            .map_err(|error| error.to_string())?;
        context
            .ask("go", "Go on?")
            .await
            .map_err(|error| error.to_string())?;
        Ok(price)
    })
}

/// `shape` revision 2: reads `price` as `{"amount": …}`, with `price` ↔ `price` and a
/// declared conversion from revision 1's shape (or one that refuses, `convertible`).
fn shape_v2(convertible: bool) -> DurableFunction {
    DurableFunction::with_identity("shape", 2, "shape:v2", |context, _| async move {
        let price: serde_json::Value = context
            .step("price", Recovery::Idempotent, |_| async {
                Ok(json!({"amount": 5}))
            })
            .await
            .map_err(|error| error.to_string())?;
        context
            .ask("go", "Go on?")
            .await
            .map_err(|error| error.to_string())?;
        Ok(json!({"revision": 2, "price": price}))
    })
    .corresponds(1, |step| Some(step.to_owned()))
    .converts(1, move |step, result| {
        if !convertible {
            return Err(format!("{step}: cents have no amount here"));
        }
        let cents = serde_json::from_str::<serde_json::Value>(result)
            .map_err(|error| error.to_string())?["cents"]
            .as_u64()
            .ok_or("no cents")?;
        Ok(json!({"amount": cents / 100}).to_string())
    })
}

/// F-3: `use_latest` moves to a revision whose results' shape changed only through its
/// declared conversion: the new code reads the converted result (the committed one stays as
/// it was); a result that does not convert is a difference, and the execution pauses.
#[tokio::test]
async fn f3_use_latest_converts_committed_results_or_pauses_on_what_does_not_convert() {
    for convertible in [true, false] {
        let restarts = Restarts::new();
        let runtime = restarts.open_with(|builder| builder.function(shape_v1()));
        let started = runtime
            .start_function(
                restarts.session,
                FunctionStart {
                    function: "shape".into(),
                    policy: Some(openprogram::VersionPolicy::UseLatest),
                    ..Default::default()
                },
            )
            .await
            .expect("start");
        let execution = started.started.execution_id;
        let waiting = wait_function(&runtime, &restarts, execution, "waiting", |s| {
            s.state == "waiting"
        })
        .await;
        runtime.halt();
        drop(runtime);
        let runtime = restarts
            .open_with(|builder| builder.function(shape_v1()).function(shape_v2(convertible)));
        let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "answer",
            "wait_id": waiting.waits[0].wait_id, "answer": "yes"});
        let reply = runtime
            .command(
                restarts.session,
                execution,
                openprogram::Command::from_json(&body).expect("answer"),
            )
            .await
            .expect("answer");
        assert_eq!(reply.status, "applied", "{reply:?}");
        if convertible {
            // The wait of revision 1 was answered before the switch; revision 2's `go`
            // is another run's ask of the same id: read back.
            let done = wait_function(&runtime, &restarts, execution, "completed", |s| {
                s.state == "completed"
            })
            .await;
            assert_eq!(done.text, r#"{"price":{"amount":5},"revision":2}"#);
            let function = done.function.expect("function");
            assert_eq!(function.revision, 2);
            assert_eq!(function.completed_steps[0].revision, 1, "provenance kept");
        } else {
            let paused = wait_function(&runtime, &restarts, execution, "version_conflict", |s| {
                s.pause_reason.as_deref() == Some("version_conflict")
            })
            .await;
            let differences = paused.function.expect("function").differences;
            assert!(
                differences[0].contains("does not convert to revision 2"),
                "{differences:?}"
            );
        }
        runtime.halt();
    }
}
