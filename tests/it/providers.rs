//! The real providers against a local stub of each API (`model_stub`): whole agent turns,
//! cut-off streams (E-3, R-5), refusals of what was not offered, and the API key kept out of
//! everything the runtime stores. What their errors become (E-6): `providers_errors.rs`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openprogram::agent::{Echo, ToolSpec};
use openprogram::providers::{Api, ApiKey, HttpProvider, ProviderConfig, RetryPolicy};
use openprogram::storage::{ExecutionId, SessionId};
use openprogram::{Runtime, StartRequest};
use serde_json::{json, Value};

use crate::model_stub::{openai_text_frames, openai_tool_call_frames, Reply, Stub};

pub(crate) const KEY: &str = "sk-test-4f1c9e7a-never-stored";

/// Fast retries: the tests wait for the stub's `Retry-After`, not for the default backoff.
pub(crate) fn quick_retries(max_retries: u32) -> RetryPolicy {
    RetryPolicy {
        max_retries,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        max_wait: Duration::from_secs(10),
        execution_retries: 20,
    }
}

pub(crate) fn config(api: Api, stub: &Stub, stream: bool) -> ProviderConfig {
    let mut config = ProviderConfig::new(api, "stub-model")
        .base_url(match api {
            Api::OpenAi => format!("{}/v1", stub.url),
            Api::Anthropic => stub.url.clone(),
        })
        .api_key(ApiKey::new(KEY))
        .stream(stream)
        .retry(quick_retries(3))
        .tool(ToolSpec::of(&Echo));
    config.read_timeout = Duration::from_secs(10);
    config
}

pub(crate) struct Turn {
    pub(crate) runtime: Runtime,
    pub(crate) session: SessionId,
    pub(crate) dir: tempfile::TempDir,
}

impl Turn {
    pub(crate) fn open(config: ProviderConfig) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let provider = HttpProvider::new(config).expect("provider");
        let runtime = Runtime::builder()
            .data_dir(dir.path())
            .provider(Arc::new(provider))
            .open()
            .expect("open the runtime");
        Self {
            runtime,
            session: SessionId::new(),
            dir,
        }
    }

    /// Starts a turn; its id.
    pub(crate) async fn start(&self, message: &str) -> ExecutionId {
        self.runtime
            .start_execution(
                self.session,
                StartRequest {
                    message: message.into(),
                    ..Default::default()
                },
            )
            .await
            .expect("start")
            .execution_id
    }

    /// Starts a turn and waits for its end; its snapshot.
    pub(crate) async fn run(&self, message: &str) -> (ExecutionId, openprogram::Snapshot) {
        let execution = self.start(message).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let snapshot = self
                .runtime
                .snapshot(self.session, execution)
                .await
                .expect("snapshot");
            if matches!(snapshot.state, "completed" | "failed" | "cancelled") {
                return (execution, snapshot);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the turn did not end: {snapshot:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Every file under `dir`, read whole: none may hold `needle`.
pub(crate) fn assert_nowhere_in(dir: &Path, needle: &str) {
    let mut files = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).expect("read dir") {
                stack.push(entry.expect("entry").path());
            }
        } else {
            files += 1;
            let bytes = std::fs::read(&path).expect("read file");
            assert!(
                !bytes
                    .windows(needle.len())
                    .any(|window| window == needle.as_bytes()),
                "{} holds the API key",
                path.display()
            );
        }
    }
    assert!(files > 0, "nothing was stored under {}", dir.display());
}

fn messages(request: &crate::model_stub::Recorded) -> &Vec<Value> {
    request.body["messages"].as_array().expect("messages")
}

#[tokio::test]
async fn e3_openai_a_streamed_turn_with_two_tool_calls_completes() {
    let stub = Stub::start(vec![
        Reply::Stream {
            frames: openai_tool_call_frames("echo", r#"{"text":"first"}"#),
            cut: false,
        },
        Reply::Stream {
            frames: openai_tool_call_frames("echo", r#"{"text":"second"}"#),
            cut: false,
        },
        Reply::Stream {
            frames: openai_text_frames(&["Both ", "echoed."]),
            cut: false,
        },
    ]);
    let turn = Turn::open(config(Api::OpenAi, &stub, true).system("Be brief."));
    let (execution, snapshot) = turn.run("Echo twice").await;
    assert_eq!(snapshot.state, "completed", "{snapshot:?}");
    assert_eq!(snapshot.text, "Both echoed.");
    assert_eq!(
        snapshot
            .receipts
            .iter()
            .filter(|receipt| receipt.tool == "echo" && receipt.status == "confirmed")
            .count(),
        2
    );
    let requests = stub.requests();
    assert_eq!(requests.len(), 3, "one request per decision");
    assert_eq!(requests[0].path, "/v1/chat/completions");
    assert_eq!(
        requests[0].header("authorization"),
        Some(&*format!("Bearer {KEY}"))
    );
    let first = &requests[0].body;
    assert_eq!(first["model"], "stub-model");
    assert_eq!(first["stream"], true);
    assert_eq!(first["tools"][0]["function"]["name"], "echo");
    assert_eq!(
        messages(&requests[0])[0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(
        messages(&requests[0])[1],
        json!({"role": "user", "content": "Echo twice"})
    );
    // The third request carries both calls, each answered by its own result.
    let third = messages(&requests[2]);
    assert_eq!(third[2]["tool_calls"][0]["id"], "call00001");
    assert_eq!(
        third[2]["tool_calls"][0]["function"]["arguments"],
        r#"{"text":"first"}"#
    );
    assert_eq!(
        third[3],
        json!({"role": "tool", "tool_call_id": "call00001", "content": "first"})
    );
    assert_eq!(third[4]["tool_calls"][0]["id"], "call00002");
    assert_eq!(
        third[5],
        json!({"role": "tool", "tool_call_id": "call00002", "content": "second"})
    );
    assert!(!turn
        .runtime
        .events(turn.session, execution, 0)
        .expect("events")
        .is_empty());
    turn.runtime.shutdown().await;
    assert_nowhere_in(turn.dir.path(), KEY);
}

#[tokio::test]
async fn e3_anthropic_a_turn_with_two_tool_calls_completes() {
    let tool_use = |id: &str, text: &str| {
        Reply::json(&json!({
            "type": "message", "role": "assistant", "stop_reason": "tool_use",
            "content": [{"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": id, "name": "echo", "input": {"text": text}}],
            "usage": {"input_tokens": 10, "output_tokens": 4},
        }))
    };
    let stub = Stub::start(vec![
        tool_use("toolu_a", "one"),
        tool_use("toolu_b", "two"),
        Reply::json(&json!({
            "type": "message", "role": "assistant", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "Done: one, two."}],
            "usage": {"input_tokens": 30, "output_tokens": 6},
        })),
    ]);
    let turn = Turn::open(config(Api::Anthropic, &stub, false));
    let (execution, snapshot) = turn.run("Echo one and two").await;
    assert_eq!(snapshot.state, "completed", "{snapshot:?}");
    assert_eq!(snapshot.text, "Done: one, two.");
    // E-6: each decision's tokens recorded with it, summed in the snapshot and the metrics.
    let recorded: Vec<(u64, u64)> = turn
        .runtime
        .events(turn.session, execution, 0)
        .expect("events")
        .iter()
        .filter_map(|envelope| match envelope.event {
            openprogram::storage::Event::ModelUsage {
                input_tokens,
                output_tokens,
                ..
            } => Some((input_tokens, output_tokens)),
            _ => None,
        })
        .collect();
    assert_eq!(recorded, vec![(10, 4), (10, 4), (30, 6)]);
    assert_eq!(
        (snapshot.usage.input_tokens, snapshot.usage.output_tokens),
        (50, 14)
    );
    assert_eq!(turn.runtime.inspect().model_tokens(), (50, 14));
    let requests = stub.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0].path, "/v1/messages");
    assert_eq!(requests[0].header("x-api-key"), Some(KEY));
    assert_eq!(requests[0].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(requests[0].body["max_tokens"], 4096);
    assert_eq!(
        requests[0].body["tools"][0]["input_schema"]["required"],
        json!(["text"])
    );
    let third = messages(&requests[2]);
    assert_eq!(third.len(), 5, "{third:?}");
    // E-3: what the model said beside each call is kept and shown to it again.
    assert_eq!(
        third[1]["content"],
        json!([{"type": "text", "text": "Calling."},
            {"type": "tool_use", "id": "call00001", "name": "echo", "input": {"text": "one"}}])
    );
    assert_eq!(
        third[2]["content"][0],
        json!({"type": "tool_result", "tool_use_id": "call00001", "content": "one", "is_error": false})
    );
    assert_eq!(third[4]["content"][0]["content"], "two");
    turn.runtime.shutdown().await;
    assert_nowhere_in(turn.dir.path(), KEY);
}

#[tokio::test]
async fn r5_a_stream_cut_off_is_requested_again_and_never_kept_half() {
    let mut cut = openai_text_frames(&["This half ", "is lost"]);
    cut.truncate(2);
    let stub = Stub::start(vec![
        Reply::Stream {
            frames: cut,
            cut: true,
        },
        Reply::Stream {
            frames: openai_text_frames(&["Whole ", "answer."]),
            cut: false,
        },
    ]);
    let turn = Turn::open(config(Api::OpenAi, &stub, true));
    let (_, snapshot) = turn.run("hi").await;
    assert_eq!(snapshot.state, "completed", "{snapshot:?}");
    assert_eq!(snapshot.text, "Whole answer.");
    let requests = stub.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0].body, requests[1].body,
        "the same request, regenerated"
    );
    turn.runtime.shutdown().await;
}

#[tokio::test]
async fn e2_a_call_to_a_tool_that_was_not_offered_is_refused() {
    let stub = Stub::start(vec![Reply::Stream {
        frames: openai_tool_call_frames("shell", r#"{"program":"touch","args":["/tmp/x"]}"#),
        cut: false,
    }]);
    let turn = Turn::open(config(Api::OpenAi, &stub, true));
    let (_, snapshot) = turn.run("hi").await;
    assert_eq!(snapshot.state, "failed", "{snapshot:?}");
    assert_eq!(
        snapshot.text,
        "openai provider: the model called the tool `shell`, which it was not offered"
    );
    assert!(snapshot
        .receipts
        .iter()
        .all(|receipt| receipt.tool != "shell"));
    turn.runtime.shutdown().await;
}

/// R-5 with a real process: `serve --provider openai` killed with SIGKILL while the model's
/// response streams in; after the restart the request is made again from committed context,
/// once, and the turn ends with the whole second response — the first one's half is nowhere.
/// The key is in no response of the API, the debug endpoint or the metrics, and in no byte
/// of the data directory.
#[test]
fn r5_kill9_mid_stream_regenerates_the_request_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut half = openai_text_frames(&["Half ", "of it"]);
    half.truncate(2);
    let stub = Stub::start(vec![
        Reply::StreamHeld { frames: half },
        Reply::Stream {
            frames: openai_text_frames(&["The whole ", "answer."]),
            cut: false,
        },
    ]);
    let token = "provider-test-token";
    let served = serve_on_stub(&data, token, &stub);
    let (status, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(status, 201, "{session}");
    let executions = format!(
        "/v1/sessions/{}/executions",
        session["session_id"].as_str().expect("session id")
    );
    let (status, started) =
        served.call("POST", &executions, Some(&json!({"message": "answer me"})));
    assert_eq!(status, 201, "{started}");
    let execution = format!(
        "{executions}/{}",
        started["execution_id"].as_str().expect("execution id")
    );
    stub.wait_requests(1);
    served.kill9();
    stub.release();
    let served = serve_on_stub(&data, token, &stub);
    let deadline = std::time::Instant::now() + crate::support::DEADLINE;
    let snapshot = loop {
        let (_, snapshot) = served.call("GET", &execution, None);
        if snapshot["state"] == "completed" {
            break snapshot;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not completed: {snapshot}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(snapshot["text"], "The whole answer.");
    // Only the whole response's tokens: the half one recorded nothing.
    assert_eq!(
        snapshot["usage"],
        json!({"input_tokens": 7, "output_tokens": 3, "retries": 0})
    );
    let (_, metrics) = served.call("GET", "/metrics", None);
    let metrics = metrics.as_str().map(str::to_owned).unwrap_or_default();
    assert!(
        metrics.contains("openprogram_model_tokens_total{kind=\"output\"} 3"),
        "{metrics}"
    );
    let requests = stub.requests();
    assert_eq!(requests.len(), 2, "the request is made again once");
    assert_eq!(
        requests[0].body, requests[1].body,
        "regenerated from committed context"
    );
    let (_, events) = served.call("GET", &format!("{execution}/events?after=0"), None);
    assert!(!events.to_string().contains("Half"), "{events}");
    for path in [
        "/debug/actors",
        "/metrics",
        &execution,
        &format!("{execution}/events?after=0"),
    ] {
        let (_, body) = served.call("GET", path, None);
        assert!(!body.to_string().contains(KEY), "{path} shows the key");
    }
    served.stop();
    assert_nowhere_in(&data, KEY);
    // Nor in any line either serve logged.
    let logged = std::fs::read_to_string(crate::served::stderr_path(&data)).expect("the log");
    assert!(logged.contains("openprogram: runtime on"), "{logged}");
    assert!(!logged.contains(KEY), "{logged}");
}

/// `serve --provider openai` on `data` against `stub`, offering `echo`, its key in the
/// environment (as an operator runs it).
pub(crate) fn serve_on_stub(data: &Path, token: &str, stub: &Stub) -> crate::served::Served {
    let base_url = format!("{}/v1", stub.url);
    let args = [
        "--provider",
        "openai",
        "--model",
        "stub-model",
        "--base-url",
        &base_url,
        "--api-key-env",
        "OP_TEST_MODEL_KEY",
        "--model-tools",
        "echo",
    ];
    let env = [("OP_TEST_MODEL_KEY", KEY)];
    crate::served::Served::start_with_env(data, token, &[], &args, &env)
}

/// Usage errors of `serve --provider` exit 2 with a message naming what is wrong, before
/// anything is opened: an unset key variable (named, no value shown), an unknown provider, a
/// tool to offer that does not exist.
#[test]
fn e2_serve_refuses_a_provider_it_cannot_configure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "--provider",
                "openai",
                "--model",
                "m",
                "--api-key-env",
                "OP_TEST_UNSET_KEY_VAR",
            ],
            "the environment variable OP_TEST_UNSET_KEY_VAR is not set",
        ),
        (
            &["--provider", "gemini", "--model", "m"],
            "unknown provider `gemini`",
        ),
        (
            &[
                "--provider",
                "openai",
                "--model",
                "m",
                "--model-tools",
                "echo,nope",
            ],
            "--model-tools: no tool is called `nope`",
        ),
    ];
    for (args, expected) in cases {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_openprogram"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(dir.path().join("data"))
            .args(args)
            .env_remove("OP_TEST_UNSET_KEY_VAR")
            .output()
            .expect("run serve");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!dir.path().join("data").exists(), "{args:?} opened a store");
    }
}

/// E-2: `examples/agent.rs`, the README's real-model agent, runs a turn against an
/// OpenAI-compatible server (the stub) with its own tool: built by this test if missing.
#[test]
fn e2_the_agent_example_runs_a_turn_on_a_compatible_server() {
    // Cargo says where it put the example (wherever the target directory is).
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = std::process::Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--example",
            "agent",
            "--message-format=json",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("cargo build --example agent");
    assert!(built.status.success(), "the example does not build");
    let example = String::from_utf8_lossy(&built.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|message| message["target"]["name"] == "agent" && message["executable"].is_string())
        .and_then(|message| message["executable"].as_str().map(std::path::PathBuf::from))
        .expect("cargo names the example's executable");
    let stub = Stub::start(vec![
        Reply::Stream {
            frames: openai_tool_call_frames("weather", r#"{"city":"Lisbon"}"#),
            cut: false,
        },
        Reply::Stream {
            frames: openai_text_frames(&["Sunny, ", "21 °C."]),
            cut: false,
        },
    ]);
    let output = std::process::Command::new(example)
        .arg("Weather in Lisbon?")
        .env("OPENAI_BASE_URL", format!("{}/v1", stub.url))
        .env("OPENAI_MODEL", "stub-model")
        .env("OPENAI_API_KEY", KEY)
        .env_remove("OPENPROGRAM_DATA")
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.starts_with("completed: Sunny, 21 °C."), "{stdout}");
    assert!(stdout.contains(" weather confirmed"), "{stdout}");
    assert!(stdout.contains("tokens: 7 in, 3 out"), "{stdout}");
    let requests = stub.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body["tools"][0]["function"]["name"], "weather");
    assert_eq!(
        messages(&requests[1])[3],
        json!({"role": "tool", "tool_call_id": "call00001", "content": "sunny and 21 °C in Lisbon"})
    );
}

/// E-3: a decision keeps everything the model produced — the text said beside a tool call and
/// its reasoning — in the decision's event; the text is shown to the model again, the
/// reasoning is not sent back (the APIs that return it do not take it as input).
#[tokio::test]
async fn e3_the_checkpoint_keeps_text_and_reasoning_beside_a_tool_call() {
    let stub = Stub::start(vec![
        Reply::json(&json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": "Let me echo it.",
                "reasoning_content": "The user wants an echo.",
                "tool_calls": [{"id": "x", "type": "function",
                    "function": {"name": "echo", "arguments": "{\"text\":\"hi\"}"}}]}}]})),
        Reply::Stream {
            frames: vec![
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"Echoed; \"}}]}\n\n".into(),
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"say so.\"}}]}\n\n".into(),
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Done.\"},\"finish_reason\":\"stop\"}]}\n\n".into(),
                "data: [DONE]\n\n".into(),
            ],
            cut: false,
        },
    ]);
    // Streamed requests; the first answer comes as JSON (read as JSON), the second streams.
    let turn = Turn::open(config(Api::OpenAi, &stub, true));
    let (execution, snapshot) = turn.run("echo hi").await;
    assert_eq!(snapshot.state, "completed", "{snapshot:?}");
    assert_eq!(snapshot.text, "Done.");
    let decisions: Vec<Value> = turn
        .runtime
        .events(turn.session, execution, 0)
        .expect("events")
        .iter()
        .filter_map(|envelope| match &envelope.event {
            openprogram::storage::Event::ModelDecided { decision, .. } => {
                serde_json::from_str(decision).ok()
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        decisions,
        vec![
            json!({"tool": {"tool": "echo", "args": {"text": "hi"}, "text": "Let me echo it.",
                "reasoning": ["The user wants an echo."]}}),
            json!({"reply": {"text": "Done.", "reasoning": ["Echoed; say so."]}}),
        ]
    );
    let second = messages(&stub.requests()[1]).clone();
    assert_eq!(second[1]["content"], "Let me echo it.");
    assert_eq!(second[1]["tool_calls"][0]["function"]["name"], "echo");
    assert!(!Value::Array(second).to_string().contains("The user wants"));
    turn.runtime.shutdown().await;
}
