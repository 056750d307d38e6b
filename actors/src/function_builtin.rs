//! The built-in durable functions of SPEC §6, for demos, tests and load: `steps`
//! revisions 1 to 3 (how tests deploy new code across a restart, F-3), `fanout` (named
//! parallel branches) and `nested` (a nested workflow).

use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::agent::{find_record, Reconciliation};
use crate::append_file::append;
use crate::function::{
    DurableFunction, FunctionContext, FunctionRegistry, Recovery, StepError, StepRef,
};

/// The longest `sleep_ms` a step of `steps` takes.
const SLEEP_MS_MAX: u64 = 60_000;

/// Every built-in function, each revision.
pub fn builtin() -> FunctionRegistry {
    let mut registry = FunctionRegistry::default();
    // Built-ins have distinct names and revisions: nothing to conflict with.
    let functions = [
        steps(1, "s", false),
        // Revision 2 declares `sI` ↔ `sI` with revision 1 (compatible); 3 declares nothing.
        steps(2, "s", true).corresponds(1, |step| is_numbered(step, "s").then(|| step.to_owned())),
        steps(3, "t", false),
        append_function("fanout", 1, run_fanout),
        append_function("nested", 1, run_nested),
    ];
    for function in functions {
        let _ = registry.register(function);
    }
    registry
}

/// `steps` input: `{"count": K, "path": FILE, "sleep_ms": M?}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepsInput {
    count: u32,
    path: String,
    #[serde(default)]
    sleep_ms: u64,
    /// An approval before step `ask_at`: declined, that step is skipped.
    ask_at: Option<u32>,
}

/// `steps` revision `revision`: steps `PREFIX1..PREFIXK` (`s` in revisions 1 and 2, `t` in
/// 3), each appending `PREFIXI<TAB>EFFECT_ID` to FILE with the `append` protocol (External,
/// reconcilable), `sleep_ms` before each; an `ask` (approval) before step `ask_at` (declined:
/// the step is skipped); with `summary` (revision 2), then a step `summary` appending
/// `summary<TAB>EFFECT_ID`; result `{"done": K}`.
fn steps(revision: u32, prefix: &'static str, summary: bool) -> DurableFunction {
    append_function("steps", revision, move |context, input| {
        run_steps(context, input, prefix, summary)
    })
}

/// Revision `revision` of the built-in `name` (identity `builtin:NAME:REVISION`): its body
/// takes its input decoded as `I`, which admission checks, and the `append` protocol
/// reconciles its steps.
fn append_function<I, F, Fut>(name: &str, revision: u32, body: F) -> DurableFunction
where
    I: DeserializeOwned,
    F: Fn(FunctionContext, I) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<serde_json::Value, String>> + Send + 'static,
{
    let identity = format!("builtin:{name}:{revision}");
    DurableFunction::with_identity(name, revision, &identity, move |context, input| {
        let run = serde_json::from_value(input)
            .map(|input| body(context, input))
            .map_err(|error| error.to_string());
        async move { run?.await }
    })
    .input::<I>()
    .reconcile_with(append_protocol)
    .reconcile_fences()
}

/// The wait before each step of `sleep_ms`, at most `SLEEP_MS_MAX`.
fn sleep_of(sleep_ms: u64) -> Result<Duration, String> {
    if sleep_ms > SLEEP_MS_MAX {
        return Err(format!("sleep_ms must be at most {SLEEP_MS_MAX}"));
    }
    Ok(Duration::from_millis(sleep_ms))
}

/// Whether `step` is `PREFIX` and a number (`s3`).
fn is_numbered(step: &str, prefix: &str) -> bool {
    step.strip_prefix(prefix)
        .is_some_and(|number| !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()))
}

/// The reconciler of every built-in: an `append` step took effect if and only if its line is
/// in the file the input names (`path`); confirmed, its result is the string `appended`
/// (as JSON text).
async fn append_protocol(step: StepRef, input: serde_json::Value) -> Reconciliation {
    let Some(path) = input["path"].as_str().map(str::to_owned) else {
        return Reconciliation::Unknown;
    };
    match find_record(path, step.effect_id, step.epoch).await {
        Reconciliation::Confirmed(_) => Reconciliation::Confirmed("\"appended\"".into()),
        other => other,
    }
}

/// `count` steps named `PREFIX1..`, each appending its id, then (`summary`) a step
/// `summary`; result `{"done": count}`.
async fn run_steps(
    context: FunctionContext,
    input: StepsInput,
    prefix: &'static str,
    summary: bool,
) -> Result<serde_json::Value, String> {
    let sleep = sleep_of(input.sleep_ms)?;
    for index in 1..=input.count {
        let step_id = format!("{prefix}{index}");
        if input.ask_at == Some(index) {
            let approved = context
                .ask(&step_id, &format!("Run step {step_id}?"))
                .await
                .map_err(|error| error.to_string())?;
            if approved.is_none() {
                continue;
            }
        }
        append_step(&context, &step_id, &step_id, &input.path, sleep).await?;
    }
    if summary {
        append_step(&context, "summary", "summary", &input.path, Duration::ZERO).await?;
    }
    Ok(serde_json::json!({ "done": input.count }))
}

/// An External step `step_id` appending `LINE<TAB>EFFECT_ID` to `path` after `sleep`.
async fn append_step(
    context: &FunctionContext,
    step_id: &str,
    line: &str,
    path: &str,
    sleep: Duration,
) -> Result<(), String> {
    let path = path.to_owned();
    let line = line.to_owned();
    let done: Result<String, StepError> = context
        .step(step_id, Recovery::External, move |run| async move {
            if !sleep.is_zero() {
                tokio::time::sleep(sleep).await;
            }
            append(path, line, run.effect_id, run.epoch).await?;
            // B06: the step took effect, its result not yet returned.
            openprogram_storage::failpoint!("B06");
            Ok(String::from("appended"))
        })
        .await;
    done.map(|_| ()).map_err(|error| error.to_string())
}

/// `fanout` input: `{"branches": [NAME...], "path": FILE, "sleep_ms": M?}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FanoutInput {
    branches: Vec<String>,
    path: String,
    #[serde(default)]
    sleep_ms: u64,
}

/// `fanout`: named `parallel` branches, each appending `NAME<TAB>EFFECT_ID` (its step
/// `NAME/append`, External), at once; then a step `join` appending `join<TAB>EFFECT_ID`;
/// result `{"branches": N}`.
async fn run_fanout(
    context: FunctionContext,
    input: FanoutInput,
) -> Result<serde_json::Value, String> {
    let sleep = sleep_of(input.sleep_ms)?;
    let branches = input
        .branches
        .iter()
        .map(|name| {
            let path = input.path.clone();
            let line = name.clone();
            (name.clone(), move |branch: FunctionContext| async move {
                append_step(&branch, "append", &line, &path, sleep).await
            })
        })
        .collect();
    for result in context
        .parallel(branches)
        .await
        .map_err(|error| error.to_string())?
    {
        result?;
    }
    append_step(&context, "join", "join", &input.path, Duration::ZERO).await?;
    Ok(serde_json::json!({ "branches": input.branches.len() }))
}

/// `nested` input: `{"count": K, "path": FILE, "sleep_ms": M?}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NestedInput {
    count: u32,
    path: String,
    #[serde(default)]
    sleep_ms: u64,
}

/// `nested`: calls `steps` revision 1 as a nested workflow (`inner`: its steps are
/// `inner/s1..`), then a step `after` appending `after<TAB>EFFECT_ID`; result `{"inner":
/// RESULT}`.
async fn run_nested(
    context: FunctionContext,
    input: NestedInput,
) -> Result<serde_json::Value, String> {
    let steps = serde_json::json!({
        "count": input.count,
        "path": input.path,
        "sleep_ms": input.sleep_ms,
    });
    let inner = context
        .workflow("inner", "steps", 1, steps)
        .await
        .map_err(|error| error.to_string())?;
    append_step(&context, "after", "after", &input.path, Duration::ZERO).await?;
    Ok(serde_json::json!({ "inner": inner }))
}
