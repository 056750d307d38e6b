//! The built-in durable functions of SPEC §6, for demos, tests and load. So far: `steps`
//! revision 1.

use std::time::Duration;

use futures::FutureExt as _;
use serde::Deserialize;

use crate::agent::{append_record, find_record, Reconciliation};
use crate::function::{DurableFunction, FunctionContext, FunctionRegistry, Recovery, StepError};

/// The longest `sleep_ms` a step of `steps` takes.
const SLEEP_MS_MAX: u64 = 60_000;

/// Every built-in function, each revision.
pub fn builtin() -> FunctionRegistry {
    let mut registry = FunctionRegistry::default();
    // Built-ins have distinct names and revisions: nothing to conflict with.
    let _ = registry.register(steps_v1());
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
    /// Accepted for the contract's shape; the `ask` boundary is not built yet.
    #[serde(default)]
    #[allow(dead_code)]
    ask_at: Option<u32>,
}

/// `steps` revision 1: steps `s1..sK`, each appending `sI<TAB>EFFECT_ID` to FILE with the
/// `append` protocol (External, reconcilable), `sleep_ms` before each; result `{"done": K}`.
pub fn steps_v1() -> DurableFunction {
    DurableFunction::new("steps", 1, "builtin:steps:1", run_steps)
        .input::<StepsInput>()
        .reconcile_with(|step, input| async move {
            let Ok(input) = serde_json::from_value::<StepsInput>(input) else {
                return Reconciliation::Unknown;
            };
            match find_record(input.path, step.effect_id).await {
                Reconciliation::Confirmed(_) => Reconciliation::Confirmed(appended()),
                other => other,
            }
        })
}

/// A step's result as JSON text: the string `appended`.
fn appended() -> String {
    String::from("\"appended\"")
}

async fn run_steps(
    context: FunctionContext,
    input: serde_json::Value,
) -> Result<serde_json::Value, String> {
    let input: StepsInput = serde_json::from_value(input).map_err(|error| error.to_string())?;
    if input.sleep_ms > SLEEP_MS_MAX {
        return Err(format!("sleep_ms must be at most {SLEEP_MS_MAX}"));
    }
    for index in 1..=input.count {
        let step_id = format!("s{index}");
        let path = input.path.clone();
        let sleep = Duration::from_millis(input.sleep_ms);
        let line = step_id.clone();
        let done: Result<String, StepError> = context
            .step(&step_id, Recovery::External, move |run| {
                async move {
                    if !sleep.is_zero() {
                        tokio::time::sleep(sleep).await;
                    }
                    append_record(&path, &line, run.effect_id)?;
                    Ok(String::from("appended"))
                }
                .boxed()
            })
            .await;
        done.map_err(|error| error.to_string())?;
    }
    Ok(serde_json::json!({ "done": input.count }))
}
