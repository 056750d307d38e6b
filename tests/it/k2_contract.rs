//! K-2: the contract revision an agent execution records covers the provider, the model,
//! the system text and the tools offered (names, recovery, descriptions, parameters), so a
//! change of any of them is a new contract: recovery holds what ran under the old one, and
//! a person's Continue approves the new one for it (recorded, so it is not held again).
//! Executions recorded by a build that derived the revision from the tools alone still run.

use std::sync::Arc;

use futures::future::BoxFuture;
use openprogram::actors::env::contract_of;
use openprogram::actors::machine::Decision;
use openprogram::agent::{ModelRequest, Provider, Scripted, ToolRegistry};
use openprogram::storage::{Event, ExecutionKind};
use openprogram::RestartWindow;
use serde_json::json;

use crate::support::*;

/// A provider configured as `contract` (a model and a system text, say) that decides as
/// `inner` does.
struct Configured {
    contract: &'static str,
    inner: Arc<dyn Provider>,
}

impl Provider for Configured {
    fn decide(&self, request: ModelRequest) -> BoxFuture<'static, Result<Decision, String>> {
        self.inner.decide(request)
    }
    fn contract(&self) -> String {
        self.contract.into()
    }
}

fn configured(contract: &'static str, inner: impl Provider) -> Arc<dyn Provider> {
    Arc::new(Configured {
        contract,
        inner: Arc::new(inner),
    })
}

fn adopted(events: &[openprogram::storage::EventEnvelope]) -> usize {
    count(events, |event| {
        matches!(event, Event::ContractAdopted { .. })
    })
}

#[tokio::test]
async fn k2_a_changed_model_is_a_new_contract_held_at_recovery_until_a_person_continues() {
    let restarts = Restarts::new();
    let open = |provider: Arc<dyn Provider>| {
        restarts.open_with(|builder| {
            builder
                .provider(provider)
                .restart_window(RestartWindow::Unlimited)
        })
    };
    // Under model A, abandoned with its first model request in flight.
    let runtime = open(configured("model-a", FreezeAfter(0)));
    let execution = restarts
        .start(&runtime, vec![reply("done")])
        .await
        .execution_id;
    let attempt = |event: &Event| matches!(event, Event::AttemptStarted { .. });
    restarts
        .wait_events(&runtime, execution, "the attempt", 1, attempt)
        .await;
    crash(runtime);
    // Model B is another contract: held for a person, not run on a model it did not start on.
    let runtime = open(configured("model-b", FreezeAfter(0)));
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(
        report.held,
        vec![(execution, "incompatible_revision")],
        "{report:?}"
    );
    let held = restarts.snapshot(&runtime, execution).await;
    assert_eq!(held.state, "paused");
    assert!(!held.capabilities.contains(&"fork"), "{held:?}");
    // The person's Continue approves model B for it, in the same transition.
    let request = command_of(json!({"kind": "continue"}));
    let reply = runtime
        .command(restarts.session, execution, request)
        .await
        .expect("continue");
    assert_eq!(reply.status, "applied", "{reply:?}");
    assert_eq!(adopted(&restarts.events(&runtime, execution)), 1);
    restarts
        .wait_events(&runtime, execution, "the new attempt", 2, attempt)
        .await;
    crash(runtime);
    // Interrupted again under model B: it runs under B now, so it continues by itself.
    let runtime = open(configured("model-b", Scripted));
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(report.resumed, vec![execution], "{report:?}");
    runtime
        .wait_finished(restarts.session, execution)
        .await
        .expect("finished");
    let done = restarts.snapshot(&runtime, execution).await;
    assert_eq!((done.state, done.text.as_str()), ("completed", "done"));
    assert_eq!(
        adopted(&restarts.events(&runtime, execution)),
        1,
        "adopted once"
    );
    crash(runtime);
    let store = restarts.open_store();
    let head = store.head(execution).expect("head").expect("exists");
    let model_b = contract_of(
        &Configured {
            contract: "model-b",
            inner: Arc::new(Scripted),
        },
        &ToolRegistry::builtin(),
    );
    assert_eq!(head.revision_id, model_b.revision);
}

#[test]
fn k2_the_contract_covers_the_provider_and_each_tools_spec_and_keeps_the_tools_only_revision() {
    let tools = ToolRegistry::builtin();
    let base = contract_of(&Scripted, &tools);
    assert_eq!(
        base,
        contract_of(&Scripted, &ToolRegistry::builtin()),
        "the same on every start"
    );
    let other_model = contract_of(
        &Configured {
            contract: "model-b",
            inner: Arc::new(Scripted),
        },
        &tools,
    );
    assert_ne!(
        other_model.revision, base.revision,
        "the provider's model or system text"
    );
    assert_eq!(
        other_model.legacy, base.legacy,
        "the tools-only revision ignores the provider"
    );
    // A tool whose description (what the model is told) changed.
    let mut described = ToolRegistry::builtin();
    described.register(Arc::new(Redescribed));
    let redescribed = contract_of(&Scripted, &described);
    assert_ne!(redescribed.revision, base.revision, "a tool's description");
    assert_eq!(
        redescribed.legacy, base.legacy,
        "the same names and recovery"
    );
    // An execution recorded by a build that derived it from the tools alone runs here.
    let agent = ExecutionKind::AgentTurn;
    assert!(base.runs(agent, base.legacy) && base.runs(agent, base.revision));
    assert!(!base.runs(agent, other_model.revision));
    assert!(!base.runs(ExecutionKind::Job, other_model.revision));
    // A durable function runs no model and no tool: its code's identity judges it (F-7).
    assert!(base.runs(ExecutionKind::Function, other_model.revision));
}

/// `echo` told to the model in other words.
struct Redescribed;

impl openprogram::agent::Tool for Redescribed {
    fn name(&self) -> &str {
        "echo"
    }
    fn recovery(&self) -> openprogram::actors::machine::Recovery {
        openprogram::actors::machine::Recovery::Idempotent
    }
    fn description(&self) -> String {
        "Repeats what it is given.".into()
    }
    fn call(
        &self,
        _call: openprogram::agent::ToolCall,
    ) -> futures::future::BoxFuture<'static, openprogram::agent::ToolResult> {
        use futures::FutureExt;
        futures::future::ready(Ok(String::new())).boxed()
    }
}
