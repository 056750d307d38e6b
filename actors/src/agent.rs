//! What the embedder plugs in (E-2): a `Provider` that makes model decisions and `Tool`s,
//! each declaring how it recovers. Also the built-ins of SPEC §6: the `scripted` provider
//! and the `echo`, `sleep`, `append`, `shell` and `fail` tools.
//!
//! Nothing here touches storage: a provider or tool returns a result, and the execution
//! actor records it. It imports no actor: everything a provider or tool names — the call's
//! handle, the decision it returns, how it recovers — is reachable from this one module.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// What a tool's `call` and a provider's `decide` return, and `.boxed()` to make one: here,
/// so that a tool author needs no other crate.
pub use futures::future::BoxFuture;
pub use futures::FutureExt;
use openprogram_storage::{AttemptId, EffectId, ExecutionId, OwnerId};

use crate::append_file::{append, look_up};
use crate::script::{is_digest, scripted_decision};

pub use crate::call::{AskError, CallHandle, ProcessExit, QuestionHandler, StartedProcess};
pub use crate::machine::{
    AgentInput, AskDetails, AskKind, Decision, LiveOutcome, ModelUsage, Recovery, ToolArgs, Turn,
};
pub use crate::wait_request::WaitSpec;

/// What a provider decides from: the immutable input and the committed context.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub execution_id: ExecutionId,
    pub effect_id: EffectId,
    pub input: std::sync::Arc<AgentInput>,
    /// Decisions, tool results, resolved waits and steer texts committed so far in this
    /// turn, oldest first.
    pub context: std::sync::Arc<Vec<Turn>>,
    /// E-8: the earlier turns of this turn's branch, oldest first (a compaction's summary in
    /// place of those it replaced). `crate::context::conversation` writes the whole request.
    pub earlier: crate::context::Branch,
    /// E-8: how many of the branch's oldest entries were left out for the context budget.
    pub left_out: u32,
    /// Model decisions made so far.
    pub iterations: u32,
    /// What the execution's model calls used before this one (tokens, retries): a provider
    /// charges its retries against the execution's retry budget with it (E-6).
    pub used: ModelUsage,
    /// Where the provider reports what this call used.
    pub usage: UsageMeter,
    /// Where a streaming provider publishes the response's pieces as they arrive (E-3).
    pub deltas: crate::deltas::DeltaSink,
}

impl ModelRequest {
    /// The conversation the request carries, as both provider APIs write it (E-8): the
    /// earlier turns of its branch, then its own.
    pub fn messages(&self) -> Vec<crate::context::Message> {
        crate::context::conversation(
            &self.earlier,
            self.left_out,
            &self.input.message,
            &self.context,
        )
    }
}

/// Where a provider reports what its call used — tokens and retries — for a decision and
/// for an error alike (a refused or cut-off response was paid for too). The execution records them
/// with the call's outcome, in the same transition; a call cut off by a crash or a cancel
/// records none (nothing of it is kept).
#[derive(Debug, Clone, Default)]
pub struct UsageMeter(Arc<std::sync::Mutex<Option<ModelUsage>>>);

impl UsageMeter {
    /// Adds `usage` to what the call used so far (a provider that retried may report each
    /// response it read).
    pub fn record(&self, usage: ModelUsage) {
        if let Ok(mut total) = self.0.lock() {
            total.get_or_insert_with(ModelUsage::default).add(usage);
        }
    }

    /// What was reported, if anything.
    pub fn take(&self) -> Option<ModelUsage> {
        self.0.lock().ok().and_then(|mut total| total.take())
    }
}

/// Makes model decisions. An `Err` is a known model error: it gets a response record and
/// fails the execution (E-6).
pub trait Provider: Send + Sync + 'static {
    fn decide(&self, request: ModelRequest) -> BoxFuture<'static, Result<Decision, String>>;

    /// What of this provider decides what an execution does, as text: its API, model and
    /// system text (K-2). It is part of the runtime's contract revision: a change of it is
    /// a new contract, under which recovery holds what ran under the old one for a person
    /// to continue. Empty (the default) for a provider whose decisions nothing configures.
    fn contract(&self) -> String {
        String::new()
    }
}

/// One tool call. A tool that hands out capabilities (a page token, a session) binds them
/// to `attempt_id`/`owner_id` and refuses them from another attempt (E-7).
#[derive(Debug, Clone)]
pub struct ToolCall {
    pub execution_id: ExecutionId,
    pub effect_id: EffectId,
    pub attempt_id: AttemptId,
    pub owner_id: OwnerId,
    /// The calling attempt's fencing epoch: a resource that remembers the newest epoch it saw
    /// can refuse a superseded attempt's late call (RELIABILITY R06).
    pub epoch: u64,
    pub args: serde_json::Value,
    /// What the call can ask of its execution while it runs: a live question (W-4).
    pub handle: CallHandle,
}

/// What a tool's reconcile protocol learned about an effect whose outcome was unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciliation {
    /// It took effect; the output stands as its result.
    Confirmed(String),
    /// It never took effect; it may run again.
    NotApplied,
    /// The protocol cannot tell (or the tool has none): an operator's `reconcile` decides.
    Unknown,
}

/// Why a tool call returned no result. A `String` (`?` on a `Result<_, String>`, or
/// `.into()`) is `Failed`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The call failed and its failure is its outcome: a `failed` receipt, shown to the model.
    #[error("{0}")]
    Failed(String),
    /// The call may or may not have taken effect: its request went out and its answer was
    /// lost (a timeout after sending, a dropped connection). An `External` tool's call gets an
    /// `unknown` receipt and awaits reconciliation, never run again blindly; any other
    /// tool's call, which may run again, a `failed` one.
    #[error("outcome unknown: {0}")]
    Unknown(String),
}

impl From<String> for ToolError {
    fn from(error: String) -> Self {
        Self::Failed(error)
    }
}

impl From<&str> for ToolError {
    fn from(error: &str) -> Self {
        Self::Failed(error.to_owned())
    }
}

/// What a tool call returns: its output, or why there is none.
pub type ToolResult = Result<String, ToolError>;

/// A tool. `Err` is a tool error (a `failed` or `unknown` receipt), not a runtime failure.
pub trait Tool: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn recovery(&self) -> Recovery;
    fn call(&self, call: ToolCall) -> BoxFuture<'static, ToolResult>;

    /// asks the external system whether the call with `call.effect_id` took effect.
    /// Called once the attempt that dispatched it is superseded — which, unless
    /// `reconcile_fences`, means gone: another process's, or this one's before a restart.
    /// Default: no protocol.
    fn reconcile(&self, call: ToolCall) -> BoxFuture<'static, Reconciliation> {
        let _ = call;
        futures::future::ready(Reconciliation::Unknown).boxed()
    }

    /// Whether `reconcile`'s answer stands while the dispatching attempt may still run the
    /// call in this very process (its attempt lease lapsed, its actor slow): true when the
    /// protocol fences the effect at `call.epoch` at the resource, so the older call's late
    /// effect is refused there (`append` does, `append_file`). Otherwise such an effect
    /// waits for an operator. Default: false.
    fn reconcile_fences(&self) -> bool {
        false
    }

    /// What a model is told the tool does, when a real provider offers it.
    /// Default: nothing beyond its name.
    fn description(&self) -> String {
        String::new()
    }

    /// The JSON Schema of the tool's arguments, for a real provider. Default: any object.
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }

    /// E-7: the attempt `attempt_id` of `execution_id` ended — its execution completed,
    /// failed, was cancelled, paused or waits for a person, or another attempt took it over:
    /// what this tool bound to that attempt (a browser page, a token it issued) can go, as
    /// no call of that attempt comes any more. A crashed process's attempts are not told:
    /// the next attempt's calls name an attempt of their own. Called on the execution's
    /// actor thread: return at once (hand slow work to a task). Default: nothing bound.
    fn release(&self, execution_id: ExecutionId, attempt_id: AttemptId) {
        let _ = (execution_id, attempt_id);
    }
}

/// What a model is told about a tool it may call: its name, what it does and the JSON Schema
/// of its arguments. A real provider offers exactly the specs it was given, and refuses a
/// model's call to any other tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
}

impl ToolSpec {
    pub fn of(tool: &dyn Tool) -> Self {
        Self {
            name: tool.name().to_owned(),
            description: tool.description(),
            parameters: tool.parameters(),
        }
    }
}

/// The tools an execution may call, by name.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: HashMap<String, Arc<dyn Tool>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// The built-in tools of SPEC §6.
    pub fn builtin() -> Self {
        let mut registry = Self::default();
        registry.register(Arc::new(Echo));
        registry.register(Arc::new(Sleep));
        registry.register(Arc::new(Append));
        registry.register(Arc::new(Fail));
        registry.register(Arc::new(Shell));
        registry.register(Arc::new(Call));
        registry
    }

    /// Adds a tool, replacing one of the same name.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.name().to_owned(), tool);
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.get(name).cloned()
    }

    /// E-7: tells every tool that the attempt `attempt_id` of `execution_id` ended.
    pub fn release(&self, execution_id: ExecutionId, attempt_id: AttemptId) {
        for tool in self.tools.values() {
            tool.release(execution_id, attempt_id);
        }
    }

    /// Every tool's spec and recovery, in name order: what the runtime's contract revision
    /// covers of its tools (K-2).
    pub fn contract(&self) -> Vec<(ToolSpec, Recovery)> {
        let mut contract: Vec<_> = self
            .tools
            .values()
            .map(|tool| (ToolSpec::of(tool.as_ref()), tool.recovery()))
            .collect();
        contract.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        contract
    }

    /// The spec of the tool called `name`, to offer it to a model; `None` if there is none.
    pub fn spec(&self, name: &str) -> Option<ToolSpec> {
        self.tools.get(name).map(|tool| ToolSpec::of(tool.as_ref()))
    }

    /// How a tool recovers; an unknown tool is treated as `External` (never re-run blindly).
    pub fn recovery(&self, name: &str) -> Recovery {
        self.tools
            .get(name)
            .map_or(Recovery::External, |tool| tool.recovery())
    }
}

/// The built-in provider: each decision takes the next element of the execution's script:
/// `{"tool": NAME, "args": {...}}`, `{"ask": "question"}`, `{"reply": "text"}`, or
/// `{"digest": true}`, which replies with the conversation the request carries (E-8). An `ask`
/// is an approval that guards the next element: approved, it runs; declined (or answered
/// with a discussion reply, which approves nothing), it is skipped. Decisions are a
/// function of the committed context only, so a regenerated request after a crash decides
/// the same thing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Scripted;

impl Provider for Scripted {
    fn decide(&self, request: ModelRequest) -> BoxFuture<'static, Result<Decision, String>> {
        // Every decision takes one element; every guarded element not approved is skipped.
        let skipped = request
            .context
            .iter()
            .filter(|turn| {
                matches!(turn, Turn::WaitResolved { status, discussion, .. }
                    if *status != openprogram_storage::WaitStatus::Answered || *discussion)
            })
            .count();
        let index = request.iterations as usize + skipped;
        let decision = match request.input.script.get(index) {
            None => Err(format!("the script has no element {index}")),
            // E-8: `{"digest": true}` replies with what the request holds, one line a part.
            Some(element) if is_digest(element.text()) => {
                Ok(Decision::reply(crate::context::digest(&request.messages())))
            }
            Some(element) => scripted_decision(element.text()),
        };
        futures::future::ready(decision).boxed()
    }

    /// Its decisions come from each execution's script: nothing else configures them.
    fn contract(&self) -> String {
        "scripted".into()
    }
}

fn string_arg(args: &serde_json::Value, name: &str) -> Result<String, String> {
    args[name]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("missing string argument `{name}`"))
}

/// `echo {text}` → the text. Idempotent.
#[derive(Debug)]
pub struct Echo;

impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn recovery(&self) -> Recovery {
        Recovery::Idempotent
    }
    fn call(&self, call: ToolCall) -> BoxFuture<'static, ToolResult> {
        futures::future::ready(string_arg(&call.args, "text").map_err(ToolError::from)).boxed()
    }
    fn description(&self) -> String {
        "Returns the text it is given.".into()
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "object",
            "properties": {"text": {"type": "string", "description": "the text to return"}},
            "required": ["text"],
        })
    }
}

/// `sleep {ms}` → waits; cancellable (the actor aborts it). Idempotent.
#[derive(Debug)]
pub struct Sleep;

/// The longest sleep the tool accepts.
const SLEEP_MS_MAX: u64 = 24 * 60 * 60 * 1000;

impl Tool for Sleep {
    fn name(&self) -> &str {
        "sleep"
    }
    fn recovery(&self) -> Recovery {
        Recovery::Idempotent
    }
    fn description(&self) -> String {
        "Waits the given number of milliseconds.".into()
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "object",
            "properties": {"ms": {"type": "integer", "minimum": 0, "maximum": SLEEP_MS_MAX}},
            "required": ["ms"],
        })
    }
    fn call(&self, call: ToolCall) -> BoxFuture<'static, ToolResult> {
        let ms = call.args["ms"].as_u64();
        async move {
            let ms = ms.ok_or("missing integer argument `ms`")?;
            if ms > SLEEP_MS_MAX {
                return Err(format!("ms must be at most {SLEEP_MS_MAX}").into());
            }
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(format!("slept {ms} ms"))
        }
        .boxed()
    }
}

/// `append {path, line}` → appends `LINE<TAB>EFFECT_ID\n` to the file and fsyncs. External:
/// its effect is outside the runtime, so a crash after dispatch leaves it `Unknown`; the
/// file is fenced by epoch (`append_file`).
#[derive(Debug)]
pub struct Append;

impl Tool for Append {
    fn name(&self) -> &str {
        "append"
    }
    fn recovery(&self) -> Recovery {
        Recovery::External
    }
    fn call(&self, call: ToolCall) -> BoxFuture<'static, ToolResult> {
        let parsed = string_arg(&call.args, "path")
            .and_then(|path| Ok((path, string_arg(&call.args, "line")?)));
        let (effect_id, epoch) = (call.effect_id, call.epoch);
        async move {
            let (path, line) = parsed?;
            append(path, line, effect_id, epoch).await?;
            // B06: the effect took place (dispatched), its response not yet returned.
            openprogram_storage::failpoint!("B06");
            Ok(String::from("appended"))
        }
        .boxed()
    }

    /// The effect took place if and only if its line, which ends with the effect id, is in
    /// the file. Sound while the dispatching attempt may still be alive: an absent effect is
    /// fenced at this attempt's epoch first (`append_file`), so a late write is refused.
    fn reconcile(&self, call: ToolCall) -> BoxFuture<'static, Reconciliation> {
        let Ok(path) = string_arg(&call.args, "path") else {
            return futures::future::ready(Reconciliation::Unknown).boxed();
        };
        find_record(path, call.effect_id, call.epoch).boxed()
    }

    fn reconcile_fences(&self) -> bool {
        true
    }
}

/// The `append` protocol's reconciliation: `Confirmed` if the effect's record is in
/// the file, `NotApplied` once it is proven absent and fenced, else `Unknown`.
pub async fn find_record(path: String, effect_id: EffectId, epoch: u64) -> Reconciliation {
    match look_up(path, effect_id, epoch).await {
        Some(true) => Reconciliation::Confirmed("appended".into()),
        Some(false) => Reconciliation::NotApplied,
        None => Reconciliation::Unknown,
    }
}

/// `shell {program, args, background?}` → a managed process (P-1). Waits for its exit and
/// returns the exit code and output tail, or with `background: true` returns its process
/// id at once. External: a crash after dispatch never starts it twice.
#[derive(Debug)]
pub struct Shell;

impl Tool for Shell {
    fn name(&self) -> &str {
        "shell"
    }
    fn recovery(&self) -> Recovery {
        Recovery::External
    }
    fn call(&self, call: ToolCall) -> BoxFuture<'static, ToolResult> {
        let program = string_arg(&call.args, "program");
        let args = match call.args.get("args") {
            None => Ok(Vec::new()),
            Some(args) => serde_json::from_value::<Vec<String>>(args.clone())
                .map_err(|_| String::from("`args` must be an array of strings")),
        };
        let background = call.args["background"].as_bool();
        let handle = call.handle;
        async move {
            let started = handle.start_process(program?, args?).await?;
            let process_id = started.process_id.to_string();
            if background == Some(true) {
                return Ok(serde_json::json!({"process_id": process_id}).to_string());
            }
            let exit = started
                .exit
                .await
                .map_err(|_| String::from("the process actor stopped before the process ended"))?;
            Ok(serde_json::json!({
                "process_id": process_id,
                "state": exit.state.as_str(),
                "exit_code": exit.exit_code,
                "output_bytes": exit.output_bytes,
                "output_tail": exit.output_tail,
            })
            .to_string())
        }
        .boxed()
    }
}

/// `fail {message}` → a tool error.
#[derive(Debug)]
pub struct Fail;

impl Tool for Fail {
    fn name(&self) -> &str {
        "fail"
    }
    fn recovery(&self) -> Recovery {
        Recovery::Idempotent
    }
    fn call(&self, call: ToolCall) -> BoxFuture<'static, ToolResult> {
        let message = string_arg(&call.args, "message").unwrap_or_else(|error| error);
        futures::future::ready(Err(message.into())).boxed()
    }
}

/// `call {function, input}` → runs the registered durable function as a child execution of
/// the agent (F-6; the scripted element `{"call": FUNCTION, "input": {...}}`) and returns its
/// result to this tool call's position before the agent's next decision. Idempotent: asked
/// again after a crash, it finds the same child (its id is derived from this call's
/// effect) and waits for it; the child's own steps carry their receipts.
#[derive(Debug)]
pub struct Call;

impl Tool for Call {
    fn name(&self) -> &str {
        "call"
    }
    fn recovery(&self) -> Recovery {
        Recovery::Idempotent
    }
    fn call(&self, call: ToolCall) -> BoxFuture<'static, ToolResult> {
        let function = match string_arg(&call.args, "function") {
            Ok(function) => function,
            Err(error) => return futures::future::ready(Err(error.into())).boxed(),
        };
        let input = call.args["input"].clone();
        let running = call.handle.call_function(function, input);
        async move { Ok(running.await?) }.boxed()
    }
}
