//! Durable functions (F-1, F-2, F-4, F-7), the embedder's side: a function is Rust code
//! registered under a name and a revision, whose body runs over a `FunctionContext` with
//! explicit boundaries. `step` is the one boundary built so far: its result is committed
//! with a receipt (E-3, E-4) before the body goes on, and on every later run of the body —
//! after a crash, a pause, a restart — a committed step returns its result without running
//! again. The body is plain async Rust: it must call its steps in the same order with the
//! same ids on every run, and keep effects inside steps.
//!
//! Like `agent.rs`, this imports no actor: the context reaches its execution only through
//! the messages below, which the execution actor answers.

use std::collections::BTreeMap;
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;

use actix::prelude::*;
use futures::future::BoxFuture;
use futures::FutureExt as _;
use openprogram_storage::{EffectId, ExecutionId, ReceiptStatus};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::mailbox::{Counted, CountedRecipient, Mailbox};

pub use crate::agent::Reconciliation;
pub use crate::function_boundary::{
    AskBoundary, Asked, Boundary, CallStarted, RevisionMissing, StepBoundary, StepDone, StepError,
    StepRun,
};
pub use crate::machine::{FunctionInput, Recovery, StepConvert, StepMap};

/// A function body: the context, and the input as the start request gave it.
pub type Body = Arc<
    dyn Fn(
            FunctionContext,
            serde_json::Value,
        ) -> BoxFuture<'static, Result<serde_json::Value, String>>
        + Send
        + Sync,
>;

/// How an External step whose outcome is unknown is looked up: the step, its effect
/// id, and the function's input.
pub type Reconciler =
    Arc<dyn Fn(StepRef, serde_json::Value) -> BoxFuture<'static, Reconciliation> + Send + Sync>;

/// An External step in doubt, as a reconciler is asked about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRef {
    pub step_id: String,
    pub effect_id: EffectId,
    /// The asking attempt's fencing epoch (see `ToolCall::epoch`).
    pub epoch: u64,
}

/// One revision of a durable function.
#[derive(Clone)]
pub struct DurableFunction {
    pub name: String,
    pub revision: u32,
    /// What the revision's code is (F-7): two registrations of one name and revision must
    /// say the same, or the second is refused.
    pub identity: String,
    body: Body,
    reconciler: Option<Reconciler>,
    /// Whether `reconciler` fences at the resource (`reconcile_fences`).
    reconcile_fences: bool,
    /// Checks an input at admission (`invalid_input`), before anything is stored.
    input_check: Option<InputCheck>,
    /// F-3: the step correspondence this revision declares with earlier ones, by revision.
    correspondences: BTreeMap<u32, Correspondence>,
    /// F-3: how committed results of an earlier revision read in this one, by revision.
    conversions: BTreeMap<u32, Conversion>,
}

/// F-3: a committed result (JSON text) of an earlier revision's step, as this revision's
/// step (its id given) reads it; `Err`: it does not convert.
pub type Conversion = Arc<StepConvert>;

/// F-3: an earlier revision's step id to this revision's step standing for it; `None`: not
/// accounted for.
pub type Correspondence = Arc<StepMap>;

/// Whether a value decodes as a function's input; why not.
pub type InputCheck = Arc<dyn Fn(&serde_json::Value) -> Result<(), String> + Send + Sync>;

impl std::fmt::Debug for DurableFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableFunction")
            .field("name", &self.name)
            .field("revision", &self.revision)
            .field("identity", &self.identity)
            .finish()
    }
}

impl DurableFunction {
    /// A revision of the function `name` whose code is identified by `identity`: what
    /// `#[durable_function]` writes, from the code. Not for an embedder's hand (F-7): an
    /// identity typed in is a promise nothing checks, and a changed body under an unchanged
    /// one would run as the old revision. The runtime's own functions and tests use it.
    #[doc(hidden)]
    pub fn with_identity<F, Fut>(name: &str, revision: u32, identity: &str, body: F) -> Self
    where
        F: Fn(FunctionContext, serde_json::Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<serde_json::Value, String>> + Send + 'static,
    {
        Self {
            name: name.to_owned(),
            revision,
            identity: identity.to_owned(),
            body: Arc::new(move |context, input| body(context, input).boxed()),
            reconciler: None,
            reconcile_fences: false,
            input_check: None,
            correspondences: BTreeMap::new(),
            conversions: BTreeMap::new(),
        }
    }

    /// F-3: declares how committed results of revision `from` read in this revision, where
    /// their shape changed: `convert(step_id, result)` gives the result this revision's
    /// step reads (JSON text), or why it does not convert — then `use_latest` pauses
    /// `version_conflict` with that difference. The results as committed stay as they were.
    pub fn converts<F>(mut self, from: u32, convert: F) -> Self
    where
        F: Fn(&str, &str) -> Result<String, String> + Send + Sync + 'static,
    {
        self.conversions.insert(from, Arc::new(convert));
        self
    }

    /// The conversion declared from revision `from`, if any.
    pub fn conversion(&self, from: u32) -> Option<&Conversion> {
        self.conversions.get(&from)
    }

    /// F-3: declares which of this revision's steps stands for each step of revision
    /// `from` (`map`: its step id to ours, `None` if none does). An execution under
    /// `use_latest` moves from `from` to this revision only if every step it committed is
    /// accounted for; otherwise it pauses `version_conflict` with the differences.
    pub fn corresponds<F>(mut self, from: u32, map: F) -> Self
    where
        F: Fn(&str) -> Option<String> + Send + Sync + 'static,
    {
        self.correspondences.insert(from, Arc::new(map));
        self
    }

    /// The correspondence declared with revision `from`, if any.
    pub fn correspondence(&self, from: u32) -> Option<&Correspondence> {
        self.correspondences.get(&from)
    }

    /// Refuses at admission (`invalid_input`) an input that does not decode as `I`.
    pub fn input<I: DeserializeOwned>(mut self) -> Self {
        self.input_check = Some(Arc::new(|value| {
            I::deserialize(value)
                .map(|_| ())
                .map_err(|error| error.to_string())
        }));
        self
    }

    /// Whether `input` is one this function takes.
    pub fn check_input(&self, input: &serde_json::Value) -> Result<(), String> {
        self.input_check
            .as_ref()
            .map_or(Ok(()), |check| check(input))
    }

    /// How this function's External steps are reconciled when their outcome is unknown
    /// . Without one, an unknown step waits for an operator's `reconcile`.
    pub fn reconcile_with<F, Fut>(mut self, reconcile: F) -> Self
    where
        F: Fn(StepRef, serde_json::Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Reconciliation> + Send + 'static,
    {
        self.reconciler = Some(Arc::new(move |step, input| reconcile(step, input).boxed()));
        self
    }

    /// Runs the body once, over `context`.
    pub fn run(
        &self,
        context: FunctionContext,
        input: serde_json::Value,
    ) -> BoxFuture<'static, Result<serde_json::Value, String>> {
        (self.body)(context, input)
    }

    pub fn reconciler(&self) -> Option<&Reconciler> {
        self.reconciler.as_ref()
    }

    /// Declares that this function's reconciler fences a step's effect at `StepRef::epoch`
    /// at the resource (see `Tool::reconcile_fences`): its answer then stands while an
    /// older attempt in this process may still run the step.
    pub fn reconcile_fences(mut self) -> Self {
        self.reconcile_fences = true;
        self
    }

    pub fn reconciler_fences(&self) -> bool {
        self.reconciler.is_some() && self.reconcile_fences
    }
}

/// Why a registration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistrationError {
    #[error("function `{name}` revision {revision} is registered with another identity")]
    IdentityConflict { name: String, revision: u32 },
    #[error("a function needs a name, a revision of at least 1 and an identity")]
    Incomplete,
}

/// The registered revisions of every function, by name and revision.
#[derive(Debug, Clone, Default)]
pub struct FunctionRegistry {
    functions: BTreeMap<(String, u32), DurableFunction>,
}

impl FunctionRegistry {
    /// Registers a revision. The same code registered again is accepted; other code under
    /// a registered name and revision is refused (F-7: current code is never labelled as
    /// an old revision).
    pub fn register(&mut self, function: DurableFunction) -> Result<(), RegistrationError> {
        if function.name.is_empty() || function.revision == 0 || function.identity.is_empty() {
            return Err(RegistrationError::Incomplete);
        }
        let key = (function.name.clone(), function.revision);
        match self.functions.get(&key) {
            Some(known) if known.identity != function.identity => {
                Err(RegistrationError::IdentityConflict {
                    name: function.name,
                    revision: function.revision,
                })
            }
            _ => {
                self.functions.insert(key, function);
                Ok(())
            }
        }
    }

    /// Only the registrations `keep` selects, by name and revision (`serve
    /// --function-revisions`).
    pub fn retain(&mut self, keep: impl Fn(&str, u32) -> bool) {
        self.functions
            .retain(|(name, revision), _| keep(name, *revision));
    }

    pub fn get(&self, name: &str, revision: u32) -> Option<&DurableFunction> {
        self.functions.get(&(name.to_owned(), revision))
    }

    /// Every registered function's name with its revisions, oldest first.
    pub fn catalog(&self) -> Vec<(String, Vec<u32>)> {
        let mut catalog: Vec<(String, Vec<u32>)> = Vec::new();
        for (name, revision) in self.functions.keys() {
            match catalog.last_mut() {
                Some((last, revisions)) if last == name => revisions.push(*revision),
                _ => catalog.push((name.clone(), vec![*revision])),
            }
        }
        catalog
    }

    /// The newest registered revision of `name`.
    pub fn latest(&self, name: &str) -> Option<&DurableFunction> {
        self.functions
            .range((name.to_owned(), 0)..=(name.to_owned(), u32::MAX))
            .next_back()
            .map(|(_, function)| function)
    }
}

/// What a function body runs over: its execution's boundaries.
#[derive(Clone)]
pub struct FunctionContext {
    execution_id: ExecutionId,
    run: u64,
    boundary: CountedRecipient<StepBoundary>,
    done: CountedRecipient<StepDone>,
    ask: CountedRecipient<AskBoundary>,
    missing: CountedRecipient<RevisionMissing>,
    called: CountedRecipient<CallStarted>,
    /// The branch or nested call this context runs in (`a/b/`), prefixed to its step and
    /// ask ids.
    scope: String,
    /// What nested `workflow`s call.
    functions: Arc<FunctionRegistry>,
    /// Set once any boundary of this run answered `Suspend`: an error a nested call then
    /// returns is the suspension's, not its own.
    suspended: Arc<std::sync::atomic::AtomicBool>,
    /// F-5: the steps this run started.
    started: Arc<StartedSteps>,
}

/// F-5: the steps a run of the body started (their code called), by effect id. One whose
/// intent is durable but which is not here when the run ends never ran. Closed when the
/// actor judges the run ended: a step told to run after that (a task the body spawned,
/// late) does not start.
#[derive(Debug, Default)]
pub(crate) struct StartedSteps(std::sync::Mutex<(std::collections::HashSet<EffectId>, bool)>);

impl StartedSteps {
    /// Marks the step started; `false` once closed (the step must not start).
    fn start(&self, effect_id: EffectId) -> bool {
        let mut steps = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (started, closed) = &mut *steps;
        !*closed && started.insert(effect_id)
    }

    /// Closes the run: of `told`, the steps that never started (and now never will).
    pub(crate) fn close(&self, told: std::collections::HashSet<EffectId>) -> Vec<EffectId> {
        let mut steps = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (started, closed) = &mut *steps;
        *closed = true;
        told.into_iter()
            .filter(|step| !started.contains(step))
            .collect()
    }
}

impl std::fmt::Debug for FunctionContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FunctionContext")
            .field("execution_id", &self.execution_id)
            .field("run", &self.run)
            .finish()
    }
}

impl FunctionContext {
    /// A run's context: its boundaries (`StepBoundary`, `StepDone`, `AskBoundary`,
    /// `RevisionMissing`) are answered by `actor`, nested calls made from `functions`.
    pub fn new<A>(
        execution_id: ExecutionId,
        run: u64,
        actor: &Mailbox<A>,
        functions: Arc<FunctionRegistry>,
    ) -> Self
    where
        A: Actor<Context = Context<A>>
            + Handler<Counted<StepBoundary>>
            + Handler<Counted<StepDone>>
            + Handler<Counted<AskBoundary>>
            + Handler<Counted<RevisionMissing>>
            + Handler<Counted<CallStarted>>,
    {
        Self {
            execution_id,
            run,
            boundary: actor.recipient(),
            done: actor.recipient(),
            ask: actor.recipient(),
            missing: actor.recipient(),
            called: actor.recipient(),
            scope: String::new(),
            functions,
            suspended: Arc::default(),
            started: Arc::default(),
        }
    }

    /// F-5: the steps this run starts, as they start.
    pub(crate) fn started_steps(&self) -> Arc<StartedSteps> {
        Arc::clone(&self.started)
    }

    /// F-1, F-4: a nested call of revision `revision` of the function `function`, recorded
    /// under `call_id`: its steps are this execution's (the parent identity kept), under
    /// `call_id/`, and its result is committed as the step `call_id` (its own record), so a
    /// later run reads the whole call back. A revision not registered pauses the execution
    /// `revision_missing` (F-3), never running other code.
    pub async fn workflow(
        &self,
        call_id: &str,
        function: &str,
        revision: u32,
        input: serde_json::Value,
    ) -> Result<serde_json::Value, StepError> {
        let record_id = self.scoped(call_id);
        let effect_id = match self.boundary(&record_id, Recovery::Idempotent).await {
            ControlFlow::Continue((effect_id, _)) => effect_id,
            ControlFlow::Break(committed) => return committed,
        };
        let Some(called) = self.functions.get(function, revision) else {
            let _ = self.missing.send(RevisionMissing { run: self.run }).await;
            return Err(self.suspend());
        };
        let record = CallStarted {
            run: self.run,
            call_id: record_id.clone(),
            function: function.to_owned(),
            revision,
            input: input.clone(),
        };
        if !matches!(self.called.send(record).await, Ok(true)) {
            return Err(self.suspend());
        }
        let mut nested = self.clone();
        nested.scope = format!("{record_id}/");
        let result = called.run(nested, input).await;
        if self.suspended.load(std::sync::atomic::Ordering::SeqCst) {
            // Its error is the run's suspension: nothing of it is a result.
            return Err(StepError::Suspended);
        }
        let (status, output) = match result {
            Ok(value) => (ReceiptStatus::Confirmed, value.to_string()),
            Err(error) => (ReceiptStatus::Failed, error),
        };
        self.commit(record_id, effect_id, status, output).await
    }

    /// Asks the execution at the boundary of the step `step_id`: continue to run it (as its
    /// effect id, by the attempt at its epoch), or break with what the body gets instead —
    /// its committed result, never run again (F-4), or this run's suspension.
    async fn boundary<T: DeserializeOwned>(
        &self,
        step_id: &str,
        recovery: Recovery,
    ) -> ControlFlow<Result<T, StepError>, (EffectId, u64)> {
        let asked = StepBoundary {
            step_id: step_id.to_owned(),
            recovery,
            run: self.run,
        };
        match self.boundary.send(asked).await {
            Ok(Boundary::Committed { status, output }) => {
                ControlFlow::Break(read_back(status, &output))
            }
            Ok(Boundary::Run { effect_id, epoch }) => ControlFlow::Continue((effect_id, epoch)),
            Ok(Boundary::Suspend) | Err(_) => ControlFlow::Break(Err(self.suspend())),
        }
    }

    /// Commits a step's outcome (E-3) and reads it back as every later run will.
    async fn commit<T: DeserializeOwned>(
        &self,
        step_id: String,
        effect_id: EffectId,
        status: ReceiptStatus,
        output: String,
    ) -> Result<T, StepError> {
        let done = StepDone {
            step_id,
            effect_id,
            status,
            output: output.clone(),
            run: self.run,
        };
        match self.done.send(done).await {
            Ok(true) => read_back(status, &output),
            Ok(false) | Err(_) => Err(self.suspend()),
        }
    }

    /// This run is suspended: every context of it says so from now on.
    fn suspend(&self) -> StepError {
        self.suspended
            .store(true, std::sync::atomic::Ordering::SeqCst);
        StepError::Suspended
    }

    /// F-1, F-4: named branches run at once, each over a context of its own whose step and
    /// ask ids are the branch's (`NAME/STEP`): each keeps its own progress, and a later run
    /// reads each branch's committed steps back. Returns each branch's result, in order.
    /// Branch names must be distinct and contain no `/`.
    pub async fn parallel<T, F, Fut>(
        &self,
        branches: Vec<(String, F)>,
    ) -> Result<Vec<Result<T, String>>, StepError>
    where
        F: FnOnce(FunctionContext) -> Fut,
        Fut: Future<Output = Result<T, String>>,
    {
        let mut names = std::collections::BTreeSet::new();
        for (name, _) in &branches {
            if name.is_empty() || name.contains('/') || !names.insert(name.clone()) {
                return Err(StepError::Failed(format!(
                    "branch names must be distinct, not empty, and without `/`: `{name}`"
                )));
            }
        }
        let running = branches.into_iter().map(|(name, branch)| {
            let mut context = self.clone();
            context.scope = format!("{}{name}/", self.scope);
            branch(context)
        });
        Ok(futures::future::join_all(running).await)
    }

    /// The id a step or ask of this context is recorded under.
    fn scoped(&self, id: &str) -> String {
        format!("{}{id}", self.scope)
    }

    /// A declared interaction boundary (W-1, W-2): a durable approval `ask_id` with
    /// `prompt`. The first time, the execution waits (`waiting`) and this run ends
    /// (`Suspended`); once a person answers or declines, the next run gets `Some(answer)` or
    /// `None` here, on every later run too.
    pub async fn ask(&self, ask_id: &str, prompt: &str) -> Result<Option<String>, StepError> {
        self.ask_with(ask_id, crate::wait_request::WaitSpec::approval(prompt))
            .await
    }

    /// `ask` with a structured question, form or permission request, or a timeout (W-6,
    /// W-8): the answer, checked against the request, is its JSON text.
    pub async fn ask_with(
        &self,
        ask_id: &str,
        spec: crate::wait_request::WaitSpec,
    ) -> Result<Option<String>, StepError> {
        // A durable wait's request is checked before it is recorded: one no answer could fit
        // is the body's error, never a wait nobody can answer.
        if spec.kind == Some(openprogram_storage::WaitKind::Live) {
            return Err(StepError::Failed(
                "a function's ask is a durable wait, never a live question".into(),
            ));
        }
        if let Some(request) = &spec.request {
            crate::wait_request::WaitRequest::from_text(request).map_err(StepError::Failed)?;
        }
        let asked = AskBoundary {
            ask_id: self.scoped(ask_id),
            spec,
            run: self.run,
        };
        match self.ask.send(asked).await {
            Ok(Asked::Answered(answer)) => Ok(Some(answer)),
            Ok(Asked::Declined) => Ok(None),
            Ok(Asked::Suspend) | Err(_) => Err(self.suspend()),
        }
    }

    pub fn execution_id(&self) -> ExecutionId {
        self.execution_id
    }

    /// A step: `run` once, its result (JSON) committed with a receipt before this returns
    /// (E-3); on every later run of the body, the committed result, `run` not called (F-4).
    /// An `External` step's intent is committed before it runs: if the process dies while
    /// it runs, its outcome is unknown and the execution waits for reconciliation,
    /// never runs it again on a guess. A step's own error is committed too, as `Failed`.
    pub async fn step<T, F, Fut>(
        &self,
        step_id: &str,
        recovery: Recovery,
        run: F,
    ) -> Result<T, StepError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(StepRun) -> Fut,
        Fut: Future<Output = Result<T, String>>,
    {
        let step_id = self.scoped(step_id);
        let (effect_id, epoch) = match self.boundary(&step_id, recovery).await {
            ControlFlow::Continue(run) => run,
            ControlFlow::Break(committed) => return committed,
        };
        if !self.started.start(effect_id) {
            // F-5: the run ended before the step started: it never will, in this run.
            return Err(self.suspend());
        }
        let result = run(StepRun {
            execution_id: self.execution_id,
            effect_id,
            epoch,
        })
        .await;
        let (status, output) = match result.map(|value| serde_json::to_string(&value)) {
            Ok(Ok(text)) => (ReceiptStatus::Confirmed, text),
            Ok(Err(error)) => (
                ReceiptStatus::Failed,
                format!("the step's result does not serialize: {error}"),
            ),
            Err(error) => (ReceiptStatus::Failed, error),
        };
        self.commit(step_id, effect_id, status, output).await
    }
}

/// A committed step's result, as the body reads it on every run.
fn read_back<T: DeserializeOwned>(status: ReceiptStatus, output: &str) -> Result<T, StepError> {
    match status {
        ReceiptStatus::Confirmed => {
            serde_json::from_str(output).map_err(|error| StepError::Decode(error.to_string()))
        }
        _ => Err(StepError::Failed(output.to_owned())),
    }
}
