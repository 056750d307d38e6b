//! The page in a real browser (B-3, B-6, W-1; issue 8): headless Chromium, driven by
//! `tests/browser/approve.mjs` (npm `playwright-core`), opens the page of a real
//! `openprogram serve`, enters a session's token and id, approves the execution waiting for
//! approval under Needs attention, sees the wait read `submitted` at once, the execution
//! complete and the History count go from 1 to 2, with no error shown on the way; and
//! `tests/browser/resolve.mjs` resolves a durable function's version conflict from the
//! page (F-3, K-7).
//!
//! Needs Node.js, Chromium (`/usr/bin/chromium`, or `CHROMIUM`) and
//! `npm ci --prefix tests/browser`, software beyond the Rust toolchain: README's test
//! command (`cargo test --workspace`) reports it ignored, with that reason. `.ci/run`
//! installs them and runs it (`-- --include-ignored`, and fails if anything is still
//! ignored). Asked to run without them, it fails and says how to install them: it never
//! passes without running.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http::call_raw;
use crate::http_cli::Serve;
use crate::support::DEADLINE;

const ADMIN: &str = "browser-test-admin-token";

/// How long the whole browser script may take (its own steps are bounded by Playwright's
/// timeouts, 20 s each).
const BROWSER_DEADLINE: Duration = Duration::from_secs(180);

/// What the test asks of the server, over HTTP.
trait Client {
    fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value);
    fn start_execution(&self, session: &str, token: &str, message: &str, script: Value) -> String;
    fn wait_for_state(&self, session: &str, token: &str, execution: &str, state: &str) -> Value;
}

impl Client for Serve {
    fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        call_raw(
            &self.url,
            method,
            path,
            Some(token),
            body.map(|body| body.to_string()),
        )
    }

    fn start_execution(&self, session: &str, token: &str, message: &str, script: Value) -> String {
        let body = json!({"kind": "agent", "message": message, "parent_message_id": null,
            "script": script, "max_iterations": 50});
        let path = format!("/v1/sessions/{session}/executions");
        let (status, started) = self.call("POST", &path, token, Some(body));
        assert_eq!(status, 201, "{started}");
        started["execution_id"].as_str().expect("id").to_string()
    }

    /// Polls the snapshot until its state is `state`.
    fn wait_for_state(&self, session: &str, token: &str, execution: &str, state: &str) -> Value {
        let path = format!("/v1/sessions/{session}/executions/{execution}");
        let deadline = Instant::now() + DEADLINE;
        loop {
            let (status, snapshot) = self.call("GET", &path, token, None);
            assert_eq!(status, 200, "{snapshot}");
            if snapshot["state"] == state {
                return snapshot;
            }
            assert!(Instant::now() < deadline, "never {state}: {snapshot}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

/// Chromium's path, once Node.js, Chromium and playwright-core are all there; otherwise a
/// failure that says how to install what is missing.
fn prerequisites() -> PathBuf {
    const HOW: &str = "`.ci/run` installs it; see README, Set-up";
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|output| output.status.success()),
        "Node.js is missing: install it (Debian: `apt-get install -y nodejs npm`); {HOW}"
    );
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        chromium.exists(),
        "Chromium is missing at {}: install it (Debian: `apt-get install -y chromium`) or set \
         CHROMIUM to its path; {HOW}",
        chromium.display()
    );
    assert!(
        browser_dir().join("node_modules/playwright-core").is_dir(),
        "npm playwright-core is missing: run `npm ci --prefix tests/browser`; {HOW}"
    );
    chromium
}

/// Runs the browser script `script` to its end (bounded) and fails the test unless it
/// succeeded; prints and returns its output.
fn passes_in_browser(script: &str, chromium: &Path, out: &Path, args: &[&str]) -> String {
    let (status, output) = in_browser(script, chromium, out, args);
    println!("{}", output.trim());
    assert!(
        status.success(),
        "the browser test failed ({status}): {}",
        output.trim()
    );
    output
}

/// Stops `serve` with SIGTERM; it must exit cleanly.
fn stopped(serve: Serve) {
    let status = serve.stop();
    assert!(status.success(), "serve after SIGTERM: {status:?}");
}

/// Runs the browser script `script` to its end (bounded); its exit status and output.
fn in_browser(
    script: &str,
    chromium: &Path,
    out: &Path,
    args: &[&str],
) -> (std::process::ExitStatus, String) {
    let stdout = out.join(format!("{script}.stdout"));
    let stderr = out.join(format!("{script}.stderr"));
    let mut node = Command::new("node")
        .arg(browser_dir().join(script))
        .args(args)
        .env("CHROMIUM", chromium)
        // Where a script saves its screenshots, if it takes any (docs/, by hand).
        .envs(std::env::var("OP_SCREENSHOTS").map(|dir| ("SCREENSHOTS", dir)))
        .stdout(File::create(&stdout).expect("stdout file"))
        .stderr(File::create(&stderr).expect("stderr file"))
        .spawn()
        .expect("spawn node");
    let deadline = Instant::now() + BROWSER_DEADLINE;
    let status = loop {
        if let Some(status) = node.try_wait().expect("wait for node") {
            break status;
        }
        if Instant::now() >= deadline {
            // By pid: the node process this test started (Chromium ends with its pipe).
            let _ = node.kill();
            let _ = node.wait();
            panic!("{script} did not finish within {BROWSER_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    (status, format!("{}{}", read(&stdout), read(&stderr)))
}

#[test]
#[ignore = "needs Chromium, Node.js and `npm ci --prefix tests/browser` (beyond the Rust \
            toolchain): `.ci/run` installs them and runs it; or install them and run \
            `cargo test --workspace -- --include-ignored browser`"]
fn b6_a_person_approves_a_waiting_execution_in_the_page_and_history_counts_it() {
    let chromium = prerequisites();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (serve, sid, token) = serve_with_session(&data, &[]);
    let (sid, token) = (sid.as_str(), token.as_str());

    // History starts at 1: a completed turn on its own branch.
    let done = serve.start_execution(sid, token, "say hello", json!([{"reply": "hello"}]));
    serve.wait_for_state(sid, token, &done, "completed");
    let script = json!([{"ask": "deploy?"}, {"tool": "echo", "args": {"text": "deployed"}},
        {"reply": "done"}]);
    let waiting = serve.start_execution(sid, token, "deploy the site", script);
    serve.wait_for_state(sid, token, &waiting, "waiting");

    let output = passes_in_browser(
        "approve.mjs",
        &chromium,
        dir.path(),
        &[&serve.url, sid, token],
    );
    assert!(
        output.contains(&waiting),
        "approved another execution: {output}"
    );

    // The server agrees with what the page showed.
    let snapshot = serve.wait_for_state(sid, token, &waiting, "completed");
    assert_eq!(snapshot["waits"][0]["status"], "answered", "{snapshot}");
    let echoed = snapshot["receipts"].as_array().into_iter().flatten();
    let echoed: Vec<&Value> = echoed.filter(|receipt| receipt["tool"] == "echo").collect();
    assert_eq!(echoed.len(), 1, "{snapshot}");
    assert_eq!(echoed[0]["status"], "confirmed", "{snapshot}");
    let path = format!("/v1/sessions/{sid}/activity");
    let (status, activity) = serve.call("GET", &path, token, None);
    assert_eq!(status, 200, "{activity}");
    assert_eq!(activity["needs_attention"], json!([]), "{activity}");
    assert_eq!(
        activity["history"].as_array().map(Vec::len),
        Some(2),
        "{activity}"
    );

    stopped(serve);
}

/// F-3, K-7 in the page: a function paused on a version conflict (started on `steps`
/// revision 1, moved to `use_latest` while it waited for an approval, then approved with
/// revision 3 deployed) shows its differences; "Keep the original code and continue"
/// completes it on revision 1.
#[test]
#[ignore = "needs Chromium, Node.js and `npm ci --prefix tests/browser` (beyond the Rust \
            toolchain): `.ci/run` installs them and runs it; or install them and run \
            `cargo test --workspace -- --include-ignored browser`"]
fn f3_a_person_resolves_a_version_conflict_in_the_page() {
    let chromium = prerequisites();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let file = dir.path().join("steps.log");
    let (serve, sid, token) = serve_with_session(&data, &["--function-revisions", "steps:1"]);
    let start = json!({"kind": "function", "function": "steps",
        "input": {"count": 2, "path": file, "ask_at": 2}});
    let (status, started) = serve.call(
        "POST",
        &format!("/v1/sessions/{sid}/executions"),
        &token,
        Some(start),
    );
    assert_eq!(status, 201, "{started}");
    let execution = started["execution_id"].as_str().expect("id").to_owned();
    let waiting = serve.wait_for_state(&sid, &token, &execution, "waiting");
    let commands = format!("/v1/sessions/{sid}/executions/{execution}/commands");
    let policy = json!({"command_id": uuid::Uuid::new_v4(), "kind": "set_policy",
        "policy": "use_latest"});
    let (status, reply) = serve.call("POST", &commands, &token, Some(policy));
    assert_eq!(
        (status, reply["status"].as_str()),
        (202, Some("applied")),
        "{reply}"
    );
    assert!(serve.stop().success());
    // Revision 3 deployed: it accounts for none of revision 1's steps.
    let serve = Serve::start(
        &data,
        &["--token", ADMIN, "--function-revisions", "steps:1,steps:3"],
    );
    let answer = json!({"command_id": uuid::Uuid::new_v4(), "kind": "answer",
        "wait_id": waiting["waits"][0]["wait_id"], "answer": "yes"});
    let (status, reply) = serve.call("POST", &commands, &token, Some(answer));
    assert_eq!(
        (status, reply["status"].as_str()),
        (202, Some("applied")),
        "{reply}"
    );
    let path = format!("/v1/sessions/{sid}/executions/{execution}");
    let deadline = Instant::now() + DEADLINE;
    while serve.call("GET", &path, &token, None).1["pause_reason"] != "version_conflict" {
        assert!(Instant::now() < deadline, "never a version conflict");
        std::thread::sleep(Duration::from_millis(50));
    }

    passes_in_browser(
        "resolve.mjs",
        &chromium,
        dir.path(),
        &[&serve.url, &sid, &token, &execution],
    );

    // The server agrees: revision 1 finished, every step once.
    let snapshot = serve.wait_for_state(&sid, &token, &execution, "completed");
    assert_eq!(snapshot["function"]["revision"], 1, "{snapshot}");
    assert_eq!(
        snapshot["function"]["policy"], "keep_original",
        "{snapshot}"
    );
    let appended: Vec<String> = std::fs::read_to_string(&file)
        .unwrap_or_default()
        .lines()
        .map(|line| line.split('\t').next().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(appended, vec!["s1", "s2"]);
    assert!(serve.stop().success());
}

/// J-1 in the page: with `serve --resource model=1` and a Job holding it, an operator
/// starts a Job from the page, sees it wait at place 1 and listed under the resource,
/// cancels the running Job from the page and sees the queued one complete and the queue
/// empty.
#[test]
#[ignore = "needs Chromium, Node.js and `npm ci --prefix tests/browser` (beyond the Rust \
            toolchain): `.ci/run` installs them and runs it; or install them and run \
            `cargo test --workspace -- --include-ignored browser`"]
fn j1_an_operator_sees_the_queue_and_a_job_wait_its_turn_in_the_page() {
    let chromium = prerequisites();
    let dir = tempfile::tempdir().expect("tempdir");
    let (serve, sid, _) = serve_with_session(&dir.path().join("data"), &["--resource", "model=1"]);
    let start = json!({"message": "holds the model", "job": {"resources": {"model": 1}},
        "script": [{"tool": "sleep", "args": {"ms": 600_000}}, {"reply": "never"}]});
    let (status, started) = serve.call(
        "POST",
        &format!("/v1/sessions/{sid}/executions"),
        ADMIN,
        Some(start),
    );
    assert_eq!(status, 201, "{started}");
    let running = started["execution_id"].as_str().expect("id").to_owned();
    serve.wait_for_state(&sid, ADMIN, &running, "running");
    passes_in_browser(
        "jobs.mjs",
        &chromium,
        dir.path(),
        &[&serve.url, &sid, ADMIN, &running],
    );
    let (status, resources) = serve.call("GET", "/v1/resources", ADMIN, None);
    assert_eq!(status, 200, "{resources}");
    assert_eq!(resources[0]["in_use"], 0, "{resources}");
    assert_eq!(resources[0]["queued"], 0, "{resources}");
    stopped(serve);
}

/// `serve --token ADMIN EXTRA…` on `data`, and a new session on it: its id and token.
fn serve_with_session(data: &Path, extra: &[&str]) -> (Serve, String, String) {
    let mut args = vec!["--token", ADMIN];
    args.extend_from_slice(extra);
    let serve = Serve::start(data, &args);
    let (status, session) = serve.call("POST", "/v1/sessions", ADMIN, None);
    assert_eq!(status, 201, "{session}");
    let sid = session["session_id"]
        .as_str()
        .expect("session id")
        .to_owned();
    let token = session["token"].as_str().expect("session token").to_owned();
    (serve, sid, token)
}

/// Issue 36 in the page: the admin's overview across sessions puts the execution that needs
/// attention first, filters by state, finds by id; the execution's timeline shows payloads,
/// durations and the attempt; a decline sent from the page completes it. With
/// `OP_SCREENSHOTS=DIR` the script saves the screenshots README shows (docs/).
#[test]
#[ignore = "needs Chromium, Node.js and `npm ci --prefix tests/browser` (beyond the Rust \
            toolchain): `.ci/run` installs them and runs it; or install them and run \
            `cargo test --workspace -- --include-ignored browser`"]
fn i3_an_operator_finds_and_resolves_an_execution_from_the_overview() {
    let chromium = prerequisites();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (serve, sid, token) = serve_with_session(&data, &[]);
    let (sid, token) = (sid.as_str(), token.as_str());
    let done = serve.start_execution(
        sid,
        token,
        "say hello",
        json!([{"tool": "echo", "args": {"text": "hello"}}, {"reply": "hello"}]),
    );
    serve.wait_for_state(sid, token, &done, "completed");
    // Another session's execution waits for an approval.
    let (status, other) = serve.call("POST", "/v1/sessions", ADMIN, None);
    assert_eq!(status, 201, "{other}");
    let (other_sid, other_token) = (
        other["session_id"].as_str().expect("id"),
        other["token"].as_str().expect("token"),
    );
    let script = json!([{"ask": "deploy?"}, {"tool": "echo", "args": {"text": "deployed"}},
        {"reply": "done"}]);
    let waiting = serve.start_execution(other_sid, other_token, "deploy the site", script);
    serve.wait_for_state(other_sid, other_token, &waiting, "waiting");
    let args = [serve.url.as_str(), ADMIN, waiting.as_str(), done.as_str()];
    passes_in_browser("overview.mjs", &chromium, dir.path(), &args);
    let snapshot = serve.wait_for_state(other_sid, other_token, &waiting, "completed");
    assert_eq!(snapshot["waits"][0]["status"], "declined", "{snapshot}");
    stopped(serve);
}

/// C-1, W-6 in the page: the transcript shows a turn's tool call and its open structured
/// question; the question is a card under Decisions whose draft survives a reload; an answer
/// missing a required item is refused with the item named; a new request never takes the
/// focus; Skip declines; the right answer completes the turn.
#[test]
#[ignore = "needs Chromium, Node.js and `npm ci --prefix tests/browser` (beyond the Rust \
            toolchain): `.ci/run` installs them and runs it; or install them and run \
            `cargo test --workspace -- --include-ignored browser`"]
fn w6_a_person_answers_a_structured_question_in_the_page() {
    let chromium = prerequisites();
    let dir = tempfile::tempdir().expect("tempdir");
    // Two turns of the session each open a question while the person types (decide.mjs):
    // they run side by side (with one turn per session, the second would wait in line).
    let (serve, sid, token) = serve_with_session(&dir.path().join("data"), &["--parallel-turns"]);
    let (sid, token) = (sid.as_str(), token.as_str());
    let script = json!([
        {"tool": "echo", "args": {"text": "checked"}},
        {"question": "Deploy where?", "items": [
            {"id": "env", "label": "Environment", "type": "choice", "options": ["staging", "prod"]},
            {"id": "checks", "label": "Checks", "type": "choice", "options": ["lint", "test"], "multiple": true},
            {"id": "replicas", "label": "Replicas", "type": "integer", "min": 1, "max": 5},
            {"id": "note", "label": "Note", "type": "text", "required": false}]},
        {"reply": "deployed"}
    ]);
    let execution = serve.start_execution(sid, token, "deploy", script);
    serve.wait_for_state(sid, token, &execution, "waiting");
    let (status, other) = serve.call("POST", "/v1/sessions", ADMIN, None);
    assert_eq!(status, 201, "{other}");
    let (other_sid, other_token) = (
        other["session_id"].as_str().expect("id"),
        other["token"].as_str().expect("token"),
    );
    let args = [
        serve.url.as_str(),
        sid,
        token,
        execution.as_str(),
        other_sid,
        other_token,
    ];
    passes_in_browser("decide.mjs", &chromium, dir.path(), &args);
    let done = serve.wait_for_state(sid, token, &execution, "completed");
    let answer: Value =
        serde_json::from_str(done["waits"][0]["answer"].as_str().expect("answer")).expect("json");
    assert_eq!(
        answer,
        json!({"env": "prod", "checks": ["test"], "replicas": 3, "note": "after lunch"}),
        "the answer as the page sent it"
    );
    let (status, all) = serve.call(
        "GET",
        &format!("/v1/sessions/{sid}/executions"),
        token,
        None,
    );
    assert_eq!(status, 200, "{all}");
    let second = all
        .as_array()
        .expect("list")
        .iter()
        .find(|snapshot| snapshot["execution_id"] != json!(execution))
        .expect("the second execution");
    assert_eq!(second["waits"][0]["status"], "declined", "{second}");
    stopped(serve);
}

/// E-8 in the page: the composer continues the conversation by default, so "continue" sent
/// after a first turn answers its reply; the transcript says the model sees one earlier
/// turn, and the scripted digest the second turn replied with holds the first turn.
#[test]
#[ignore = "needs Chromium, Node.js and `npm ci --prefix tests/browser` (beyond the Rust \
            toolchain): `.ci/run` installs them and runs it; or install them and run \
            `cargo test --workspace -- --include-ignored browser`"]
fn e8_a_second_message_sent_from_the_page_sees_the_first_turn() {
    let chromium = prerequisites();
    let dir = tempfile::tempdir().expect("tempdir");
    let (serve, sid, token) = serve_with_session(&dir.path().join("data"), &[]);
    let args = [serve.url.as_str(), sid.as_str(), token.as_str()];
    passes_in_browser("converse.mjs", &chromium, dir.path(), &args);
    let (status, all) = serve.call(
        "GET",
        &format!("/v1/sessions/{sid}/executions"),
        &token,
        None,
    );
    assert_eq!(status, 200, "{all}");
    let all = all.as_array().expect("list");
    assert_eq!(all.len(), 2, "{all:?}");
    let first = all
        .iter()
        .find(|snapshot| snapshot["text"] == "a.log is the largest.")
        .expect("the first turn");
    let second = all
        .iter()
        .find(|snapshot| snapshot["execution_id"] != first["execution_id"])
        .expect("the second turn");
    let events = serve.call(
        "GET",
        &format!(
            "/v1/sessions/{sid}/executions/{}/events?after=0",
            second["execution_id"].as_str().expect("id")
        ),
        &token,
        None,
    );
    assert_eq!(
        events.1[0]["parent_message_id"], first["reply_message_id"],
        "the second message answers the first's reply"
    );
    stopped(serve);
}

/// X-2 in the page: the one-time link `serve` wrote (no terminal here: `DATA/sign-in.url`)
/// signs the browser in: the admin panels show every session's executions with no token
/// typed, after a reload too, and with a session token typed for one session; the link is
/// refused the second time.
#[test]
#[ignore = "needs Chromium, Node.js and `npm ci --prefix tests/browser` (beyond the Rust \
            toolchain): `.ci/run` installs them and runs it; or install them and run \
            `cargo test --workspace -- --include-ignored browser`"]
fn x2_the_sign_in_link_signs_the_page_in_once_and_it_stays_signed_in() {
    let chromium = prerequisites();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (serve, sid, token) = serve_with_session(&data, &[]);
    let script = json!([{"reply": "hello"}]);
    let execution = serve.start_execution(&sid, &token, "say hello", script);
    serve.wait_for_state(&sid, &token, &execution, "completed");
    let written = data.join("sign-in.url");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !written.exists() {
        assert!(Instant::now() < deadline, "serve wrote no sign-in link");
        std::thread::sleep(Duration::from_millis(20));
    }
    let link = std::fs::read_to_string(&written).expect("the sign-in link");
    let args = [link.trim(), token.as_str(), execution.as_str()];
    passes_in_browser("signin.mjs", &chromium, dir.path(), &args);
    stopped(serve);
}

/// The page's step timeline: an execution ran a tool and asked a person; its server was
/// stopped and started again; the answer (after the restart) let it run a second tool and
/// reply. The page draws two lanes (two attempts), the calls in the order they ran coloured by
/// outcome, the wait as a gap naming a person between the two tool calls; clicking a bar opens
/// its event (`timeline.mjs`). With `OP_SCREENSHOTS=DIR` the script saves timeline.png.
#[test]
#[ignore = "needs Chromium, Node.js and `npm ci --prefix tests/browser` (beyond the Rust \
            toolchain): `.ci/run` installs them and runs it; or install them and run \
            `cargo test --workspace -- --include-ignored browser`"]
fn i3_an_executions_timeline_draws_each_attempt_and_where_its_time_went() {
    let chromium = prerequisites();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (serve, sid, token) = serve_with_session(&data, &[]);
    let (sid, token) = (sid.as_str(), token.as_str());
    let script = json!([{"tool": "echo", "args": {"text": "before"}}, {"ask": "go on?"},
        {"tool": "echo", "args": {"text": "after"}}, {"reply": "done"}]);
    let execution = serve.start_execution(sid, token, "run, ask, run", script);
    let waiting = serve.wait_for_state(sid, token, &execution, "waiting");
    let wait_id = waiting["waits"][0]["wait_id"]
        .as_str()
        .expect("a wait")
        .to_owned();
    stopped(serve);

    let serve = Serve::start(&data, &["--token", ADMIN]);
    let answer = json!({"command_id": uuid::Uuid::new_v4(), "kind": "answer",
        "wait_id": wait_id, "answer": "yes"});
    let commands = format!("/v1/sessions/{sid}/executions/{execution}/commands");
    let (status, reply) = serve.call("POST", &commands, token, Some(answer));
    assert!(status < 300, "{reply}");
    serve.wait_for_state(sid, token, &execution, "completed");
    let args = [serve.url.as_str(), sid, token, execution.as_str()];
    passes_in_browser("timeline.mjs", &chromium, dir.path(), &args);
    stopped(serve);
}

/// The page's composer: a draft kept through a reload, a durable function started from its
/// form (a revision other than the newest; input that is not JSON refused before sending), a
/// Job holding a unit picked from the queue, and a message sent with `when_busy=steer` while a
/// turn runs (`compose.mjs`). The server then holds one function run, one Job, and a steered,
/// cancelled turn.
#[test]
#[ignore = "needs Chromium, Node.js and `npm ci --prefix tests/browser` (beyond the Rust \
            toolchain): `.ci/run` installs them and runs it; or install them and run \
            `cargo test --workspace -- --include-ignored browser`"]
fn c2_f1_j1_the_composer_starts_functions_jobs_and_steers_a_running_turn() {
    let chromium = prerequisites();
    let dir = tempfile::tempdir().expect("tempdir");
    let (serve, sid, _) = serve_with_session(&dir.path().join("data"), &["--resource", "model=1"]);
    let file = dir.path().join("steps.log");
    let file = file.to_str().expect("a path");
    let args = [serve.url.as_str(), sid.as_str(), ADMIN, file];
    passes_in_browser("compose.mjs", &chromium, dir.path(), &args);
    let (status, all) = serve.call(
        "GET",
        &format!("/v1/sessions/{sid}/executions"),
        ADMIN,
        None,
    );
    assert_eq!(status, 200, "{all}");
    let all = all.as_array().expect("list");
    let kinds: Vec<_> = all
        .iter()
        .map(|s| (s["kind"].as_str(), s["state"].as_str()))
        .collect();
    assert_eq!(
        all.len(),
        3,
        "a function, a Job, a steered turn; no steer admitted: {kinds:?}"
    );
    let function = all
        .iter()
        .find(|s| s["kind"] == "function")
        .expect("the function");
    assert_eq!(function["function"]["revision"], 1, "{function}");
    assert!(std::fs::read_to_string(file)
        .expect("its step wrote")
        .starts_with("s1\t"));
    assert!(
        all.iter()
            .any(|s| !s["job"].is_null() && s["state"] == "completed"),
        "{kinds:?}"
    );
    stopped(serve);
}
