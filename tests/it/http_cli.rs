//! The real binary (I-4, X-2, R-7): `openprogram serve` on a free port prints its URL,
//! keeps its tokens in files of mode 0600, refuses a non-loopback address without a token,
//! seeds `--demo` once and stops in order on SIGTERM (by pid); `ctl` and `inspect` against
//! it, with their exit codes (0 ok, 1 failed, 2 usage).

use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http::call_raw;
use crate::support::DEADLINE;

/// A running `openprogram serve`; SIGTERM by pid and reaped on drop.
pub(crate) struct Serve {
    child: Child,
    pub(crate) url: String,
}

impl Serve {
    pub(crate) fn start(data: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_openprogram"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .args(extra)
            .env_remove("OPENPROGRAM_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn openprogram serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the listen URL");
        let url = line.trim().to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{url:?}");
        Self { child, url }
    }

    /// SIGTERM (by pid: the child this test started), then its exit status.
    pub(crate) fn stop(mut self) -> std::process::ExitStatus {
        sigterm(&self.child);
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "serve did not stop after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            sigterm(&self.child);
            let deadline = Instant::now() + DEADLINE;
            while self.child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    // By pid: the child this test started, which ignored SIGTERM.
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn sigterm(child: &Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
}

fn openprogram(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args(args)
        .env_remove("OPENPROGRAM_TOKEN")
        .output()
        .expect("run openprogram")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

/// Polls `read` until `done`, with a deadline.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !done() {
        assert!(Instant::now() < deadline, "never {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn x2_serve_generates_its_admin_token_and_session_key_with_mode_0600_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let serve = Serve::start(dir.path(), &[]);
    let token_file = dir.path().join("admin.token");
    assert_eq!(mode(&token_file), 0o600);
    assert_eq!(mode(&dir.path().join("session.key")), 0o600);
    let admin = std::fs::read_to_string(&token_file).expect("token");
    let admin = admin.trim();
    assert_eq!(call_raw(&serve.url, "GET", "/health", None, None).0, 200);
    let (status, session) = call_raw(&serve.url, "POST", "/v1/sessions", Some(admin), None);
    assert_eq!(status, 201);
    let status = serve.stop();
    assert!(status.success(), "{status:?}");

    // The same admin token and session tokens after a restart (stateless and durable).
    let serve = Serve::start(dir.path(), &[]);
    let path = format!(
        "/v1/sessions/{}/executions",
        session["session_id"].as_str().expect("id")
    );
    let token = session["token"].as_str().expect("token");
    let (status, _) = call_raw(
        &serve.url,
        "POST",
        &path,
        Some(token),
        Some(json!({"message": "x", "script": [{"reply": "ok"}]}).to_string()),
    );
    assert_eq!(status, 201);
    assert_eq!(
        call_raw(&serve.url, "POST", "/v1/sessions", Some(admin), None).0,
        201
    );
    assert!(serve.stop().success());
}

#[test]
fn x2_serve_refuses_a_non_loopback_address_without_a_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = openprogram(&[
        "serve",
        "--listen",
        "0.0.0.0:0",
        "--data",
        dir.path().to_str().expect("utf-8"),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("without a token"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// X-2: an empty or too short token (an unset `OPENPROGRAM_TOKEN=` in a compose file) is a
/// usage error, never "no token": the server does not start, on any address.
#[test]
fn x2_serve_refuses_an_empty_or_short_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    for token in ["", "  ", "short"] {
        let output = openprogram(&[
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--token",
            token,
            "--data",
            dir.path().to_str().expect("utf-8"),
        ]);
        assert_eq!(output.status.code(), Some(2), "token {token:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("at least"), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

#[test]
fn i4_ctl_and_inspect_against_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let serve = Serve::start(dir.path(), &["--token", "cli-admin"]);
    assert!(
        !dir.path().join("admin.token").exists(),
        "a given token is not written"
    );
    let (_, session) = call_raw(&serve.url, "POST", "/v1/sessions", Some("cli-admin"), None);
    let sid = session["session_id"].as_str().expect("id").to_string();
    let token = session["token"].as_str().expect("token").to_string();
    let body = json!({"message": "x", "start_paused": true, "script": [{"tool": "echo", "args": {"text": "a"}}, {"reply": "ok"}]});
    let (_, started) = call_raw(
        &serve.url,
        "POST",
        &format!("/v1/sessions/{sid}/executions"),
        Some(&token),
        Some(body.to_string()),
    );
    let eid = started["execution_id"].as_str().expect("id").to_string();
    let url = serve.url.as_str();
    let ctl = |args: &[&str]| {
        let mut all = vec!["ctl", "--url", url, "--token", token.as_str()];
        all.extend_from_slice(args);
        openprogram(&all)
    };

    let steer = ctl(&[
        "steer",
        &sid,
        &eid,
        "--text",
        "be brief",
        "--command-id",
        "0190a3e4-0000-7000-8000-000000000001",
        "--json",
    ]);
    assert!(
        steer.status.success(),
        "{}",
        String::from_utf8_lossy(&steer.stderr)
    );
    let reply: Value = serde_json::from_slice(&steer.stdout).expect("JSON");
    assert_eq!(reply["status"], "applied");
    // The same command id again: the same reply (K-4).
    let again = ctl(&[
        "steer",
        &sid,
        &eid,
        "--text",
        "be brief",
        "--command-id",
        "0190a3e4-0000-7000-8000-000000000001",
        "--json",
    ]);
    assert_eq!(
        serde_json::from_slice::<Value>(&again.stdout).expect("JSON"),
        reply
    );
    let stale = ctl(&["continue", &sid, &eid, "--expected-version", "999"]);
    assert_eq!(stale.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&stale.stderr);
    assert!(
        stderr.contains("version_conflict") && stderr.lines().count() == 1,
        "{stderr}"
    );
    let resumed = ctl(&["continue", &sid, &eid]);
    assert!(resumed.status.success());
    assert!(String::from_utf8_lossy(&resumed.stdout).contains("continue applied"));

    let inspect = |args: &[&str], token: &str| {
        let mut all = vec!["inspect", "--url", url, "--token", token];
        all.extend_from_slice(args);
        openprogram(&all)
    };
    wait_until("completed", || {
        let out = inspect(&["execution", &sid, &eid, "--json"], &token);
        serde_json::from_slice::<Value>(&out.stdout)
            .is_ok_and(|snapshot| snapshot["state"] == "completed")
    });
    let table = inspect(&["execution", &sid, &eid], &token);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("state          completed") && text.contains("[steer] be brief"),
        "{text}"
    );
    let events = inspect(&["events", &sid, &eid], &token);
    assert!(String::from_utf8_lossy(&events.stdout).contains("admitted"));
    let events_json = inspect(&["events", &sid, &eid, "--after", "1", "--json"], &token);
    let events_json: Value = serde_json::from_slice(&events_json.stdout).expect("JSON");
    assert_eq!(events_json[0]["seq"], 2);
    let actors = inspect(&["actors", "--json"], "cli-admin");
    let actors: Value = serde_json::from_slice(&actors.stdout).expect("JSON");
    assert!(actors
        .as_array()
        .expect("list")
        .iter()
        .any(|actor| actor["kind"] == "supervisor"));
    // Every session with executions, ended ones included, from the by-session index.
    let listed = inspect(&["sessions", "--json"], "cli-admin");
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    assert!(
        listed
            .as_array()
            .expect("list")
            .iter()
            .any(|row| row["session_id"] == sid.as_str() && row["executions"].as_u64() >= Some(1)),
        "{listed}"
    );
    assert!(inspect(&["executions"], "cli-admin").status.success());

    // Failures: 1 for a refused operation, 2 for a wrong command line; one line each.
    let wrong_token = inspect(&["execution", &sid, &eid], "nope");
    assert_eq!(wrong_token.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&wrong_token.stderr).contains("unauthorized"));
    assert_eq!(
        inspect(&["actors"], &token).status.code(),
        Some(1),
        "a session token is not admin"
    );
    assert_eq!(inspect(&["execution"], &token).status.code(), Some(2));
    // One id is the execution's: finding its session is an admin's read.
    let alone = inspect(&["execution", &eid], &token);
    assert_eq!(alone.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&alone.stderr).contains("unauthorized"));
    assert_eq!(ctl(&["stop-process", &sid, &eid]).status.code(), Some(2));
    assert_eq!(ctl(&["explode", &sid, &eid]).status.code(), Some(2));
    assert_eq!(
        openprogram(&["ctl", "pause", &sid, &eid]).status.code(),
        Some(2),
        "no token"
    );
    let unreachable = openprogram(&[
        "inspect",
        "--url",
        "http://127.0.0.1:1",
        "--token",
        "x",
        "actors",
    ]);
    assert_eq!(unreachable.status.code(), Some(1));
    assert!(serve.stop().success());
}

#[test]
fn i4_serve_demo_seeds_once_and_its_process_stops_through_ctl() {
    let dir = tempfile::tempdir().expect("tempdir");
    let serve = Serve::start(dir.path(), &["--demo", "--token", "demo-admin"]);
    let mut demo = Value::Null;
    wait_until("demo seeded", || {
        let (status, body) = call_raw(&serve.url, "GET", "/debug/demo", Some("demo-admin"), None);
        demo = body;
        status == 200
    });
    assert_eq!(mode(&dir.path().join("demo.json")), 0o600);
    let sessions = demo["sessions"].as_array().expect("sessions").clone();
    assert_eq!(sessions.len(), 3);
    let snapshot = |session: &Value, execution: &Value| {
        let path = format!(
            "/v1/sessions/{}/executions/{}",
            session["session_id"].as_str().expect("sid"),
            execution.as_str().expect("eid")
        );
        call_raw(&serve.url, "GET", &path, session["token"].as_str(), None).1
    };
    assert_eq!(
        snapshot(&sessions[0], &sessions[0]["executions"][0])["state"],
        "completed"
    );
    let fork = snapshot(&sessions[0], &sessions[0]["executions"][1]);
    assert_eq!(
        fork["state"], "paused",
        "the demo's fork waits for Continue: {fork}"
    );
    assert_eq!(fork["pause_reason"], "fork");
    wait_until("the demo's approval is pending", || {
        snapshot(&sessions[0], &sessions[0]["executions"][2])["state"] == "waiting"
    });
    // Durable functions: one completed, one paused on a version conflict with its
    // differences and the choice that resolves it (F-3).
    let functions = &sessions[2];
    let completed = snapshot(functions, &functions["executions"][0]);
    assert_eq!(completed["state"], "completed", "{completed}");
    assert_eq!(completed["function"]["name"], "steps", "{completed}");
    let conflict = snapshot(functions, &functions["executions"][1]);
    assert_eq!(conflict["pause_reason"], "version_conflict", "{conflict}");
    assert_eq!(conflict["function"]["revision"], 1, "{conflict}");
    assert!(
        conflict["function"]["differences"]
            .as_array()
            .is_some_and(|differences| !differences.is_empty()),
        "{conflict}"
    );
    let process_session = &sessions[1];
    let process_execution = &process_session["executions"][0];
    let mut running = Value::Null;
    wait_until("the demo process runs", || {
        running = snapshot(process_session, process_execution);
        running["processes"][0]["state"] == "running"
    });
    // If the test fails before stopping it, the demo's `sleep 3600` is ended anyway.
    let (_, actors) = call_raw(&serve.url, "GET", "/debug/actors", Some("demo-admin"), None);
    let pid = actors
        .as_array()
        .into_iter()
        .flatten()
        .filter(|actor| actor["kind"] == "process")
        .find_map(|actor| {
            let state = actor["state"].as_str()?;
            state
                .strip_prefix("pid ")?
                .split(' ')
                .next()?
                .parse::<u32>()
                .ok()
        })
        .expect("the demo process and its pid in /debug/actors");
    let _end = DemoSleep(pid);
    // Stop it (the demo leaves it running otherwise).
    let stop = openprogram(&[
        "ctl",
        "--url",
        &serve.url,
        "--token",
        process_session["token"].as_str().expect("token"),
        "stop-process",
        process_session["session_id"].as_str().expect("sid"),
        process_execution.as_str().expect("eid"),
        "--process",
        running["processes"][0]["process_id"].as_str().expect("pid"),
    ]);
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    wait_until("the demo process stopped", || {
        snapshot(process_session, process_execution)["processes"][0]["state"] == "stopped"
    });
    assert!(serve.stop().success());

    // A second start with --demo seeds nothing new: the same sessions.
    let serve = Serve::start(dir.path(), &["--demo", "--token", "demo-admin"]);
    let mut again = Value::Null;
    wait_until("demo read back", || {
        let (status, body) = call_raw(&serve.url, "GET", "/debug/demo", Some("demo-admin"), None);
        again = body;
        status == 200
    });
    assert_eq!(again, demo);
    let (_, log) = call_raw(
        &serve.url,
        "GET",
        "/debug/log?after=0",
        Some("demo-admin"),
        None,
    );
    let admitted = log
        .as_array()
        .expect("log")
        .iter()
        .filter(|event| event["type"] == "admitted")
        .count();
    assert_eq!(
        admitted, 6,
        "no duplicate demo content (three turns, a fork and two function runs)"
    );
    assert!(serve.stop().success());
}

/// Kills the demo's `sleep 3600` by pid when dropped, if that pid is still that command.
struct DemoSleep(u32);

impl Drop for DemoSleep {
    fn drop(&mut self) {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", self.0)).unwrap_or_default();
        if cmdline == b"sleep\x003600\x00" {
            let _ = Command::new("kill")
                .args(["-KILL", &self.0.to_string()])
                .status();
        }
    }
}

/// Q-1 over HTTP: `load --url` drives a running server (another process, its own store) and
/// reports what the server's events and `/metrics` say; the embedded-only options are usage
/// errors.
#[test]
fn q1_load_drives_a_running_server_over_http() {
    let dir = tempfile::tempdir().expect("tempdir");
    let serve = Serve::start(dir.path(), &["--token", "load-admin"]);
    let url = serve.url.as_str();
    let load = |extra: &[&str]| {
        let mut args = vec!["load", "--url", url, "--token", "load-admin"];
        args.extend(extra);
        openprogram(&args)
    };
    let output = load(&[
        "--executions",
        "12",
        "--steps",
        "3",
        "--concurrency",
        "4",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: Value =
        serde_json::from_str(stdout.lines().last().expect("one JSON line")).expect("JSON");
    assert_eq!(report["target"], url);
    assert_eq!(report["completed"], 12, "{report}");
    assert_eq!(report["failed"], 0, "{report}");
    assert_eq!(report["total_steps"], 36, "{report}");
    // Each step was fsynced by the server: two commits, so at least one fsync, per step
    // group; the server's counters moved.
    assert!(report["fsyncs"].as_u64().expect("fsyncs") > 0, "{report}");
    // And its committer was busy for some of the run, flushing and fsyncing in it.
    for field in [
        "committer_busy_pct",
        "committer_flush_pct",
        "committer_fsync_pct",
    ] {
        assert!(
            report[field].as_f64().unwrap_or(0.0) > 0.0,
            "{field}: {report}"
        );
    }
    assert!(
        report["peak_rss_mib"].as_f64().expect("rss") > 0.0,
        "{report}"
    );
    // The steps were the server's own: per execution 4 decisions (3 tools, the reply) and
    // 3 tool results.
    let metrics = ureq::get(&format!("{url}/metrics"))
        .set("Authorization", "Bearer load-admin")
        .call()
        .expect("metrics")
        .into_string()
        .expect("text");
    assert!(
        metrics.contains("openprogram_steps_total 84\n"),
        "{metrics}"
    );
    for flag in [
        ["--park", "3"],
        ["--commands-per-s", "5"],
        ["--baseline", "1"],
    ] {
        let refused = load(&flag);
        assert_eq!(refused.status.code(), Some(2), "{flag:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains("cannot be used with --url"), "{stderr}");
    }
    // Every admission refused (a script over the server's body limit): exit 1, with why.
    let refused = load(&[
        "--executions",
        "2",
        "--steps",
        "40",
        "--payload-bytes",
        "200000",
    ]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("no execution completed: "), "{stderr}");
    assert!(serve.stop().success());
}

/// S-7 through the binary: a store whose files lost acknowledged history (sled's files from
/// before the last run's writes, the record of what was acknowledged from after) is refused
/// by `serve` with one clear line and exit 1; `--accept-loss` lists what was lost (JSON on
/// stderr) before it serves, and keeps what remains.
#[test]
fn s7_serve_refuses_a_store_that_lost_acknowledged_history_and_accept_loss_salvages_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let older = tempfile::tempdir().expect("tempdir");
    let admin = "s7-admin-token";
    let start = |serve: &Serve, session: &str| {
        let path = format!("/v1/sessions/{session}/executions");
        let body = json!({"message": "x", "script": [{"reply": "ok"}]}).to_string();
        let (status, started) = call_raw(&serve.url, "POST", &path, Some(admin), Some(body));
        assert_eq!(status, 201, "{started}");
        started["execution_id"].as_str().expect("id").to_owned()
    };
    let serve = Serve::start(dir.path(), &["--token", admin]);
    let (_, session) = call_raw(&serve.url, "POST", "/v1/sessions", Some(admin), None);
    let session = session["session_id"].as_str().expect("id").to_owned();
    let kept = start(&serve, &session);
    assert!(serve.stop().success());
    let copy = |from: &Path, to: &Path| {
        let status = Command::new("cp")
            .args(["-a", &format!("{}/.", from.display())])
            .arg(to)
            .status()
            .expect("cp");
        assert!(status.success());
    };
    copy(dir.path(), older.path());
    let serve = Serve::start(dir.path(), &["--token", admin]);
    let lost = start(&serve, &session);
    assert!(serve.stop().success());
    std::fs::copy(
        dir.path().join("acknowledged"),
        older.path().join("acknowledged"),
    )
    .expect("copy");

    let data = older.path().to_str().expect("utf-8 path");
    let refused = openprogram(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--token",
        admin,
        "--data",
        data,
    ]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("lost acknowledged history") && stderr.contains("--accept-loss"),
        "{stderr}"
    );
    assert!(refused.stdout.is_empty(), "nothing was served: {refused:?}");

    let mut salvaging = Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--token",
            admin,
            "--accept-loss",
            "--data",
            data,
        ])
        .env_remove("OPENPROGRAM_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut url = String::new();
    BufReader::new(salvaging.stdout.take().expect("stdout"))
        .read_line(&mut url)
        .expect("the listen URL");
    let url = url.trim().to_owned();
    let snapshot = |execution: &str| {
        let path = format!("/v1/sessions/{session}/executions/{execution}");
        call_raw(&url, "GET", &path, Some(admin), None).0
    };
    assert_eq!(snapshot(&kept), 200, "what remains is served");
    assert_eq!(snapshot(&lost), 404, "created in the lost positions");
    sigterm(&salvaging);
    let output = salvaging.wait_with_output().expect("wait");
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let listed = stderr
        .lines()
        .find_map(|line| line.strip_prefix("openprogram: opened to salvage: "))
        .unwrap_or_else(|| panic!("the salvage report: {stderr}"));
    let listed: Value = serde_json::from_str(listed).expect("JSON");
    assert!(
        listed["lost_positions"].as_u64().is_some_and(|n| n > 0),
        "{listed}"
    );
    // Salvaged, the store opens again without it.
    let serve = Serve::start(older.path(), &["--token", admin]);
    assert!(serve.stop().success());
}

/// I-4, F-1, K-7: `openprogram call` starts a durable function over HTTP; `ctl set-policy`
/// changes a running one's policy; an input that is not JSON is a usage error.
#[test]
fn i4_call_starts_a_function_and_ctl_set_policy_sets_its_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let serve = Serve::start(
        dir.path(),
        &["--token", "cli-admin", "--function-revisions", "steps:1"],
    );
    let (_, session) = call_raw(&serve.url, "POST", "/v1/sessions", Some("cli-admin"), None);
    let sid = session["session_id"].as_str().expect("id").to_string();
    let path = dir.path().join("steps.log");
    let input = json!({"count": 3, "path": path, "sleep_ms": 300}).to_string();
    let target = ["--url", serve.url.as_str(), "--token", "cli-admin"];
    let mut args = vec!["call"];
    args.extend(target);
    args.extend([sid.as_str(), "steps", "--input", input.as_str(), "--json"]);
    let output = openprogram(&args);
    assert!(output.status.success(), "{output:?}");
    let started: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON line");
    assert_eq!(started["function_revision"], 1, "{started}");
    let execution = started["execution_id"].as_str().expect("id").to_string();
    let mut args = vec!["ctl"];
    args.extend(target);
    args.extend([
        "set-policy",
        sid.as_str(),
        execution.as_str(),
        "--policy",
        "use_latest",
    ]);
    let output = openprogram(&args);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("set_policy applied"), "{stdout}");
    let read = format!("/v1/sessions/{sid}/executions/{execution}");
    wait_until("completed", || {
        call_raw(&serve.url, "GET", &read, Some("cli-admin"), None).1["state"] == "completed"
    });
    let (_, snapshot) = call_raw(&serve.url, "GET", &read, Some("cli-admin"), None);
    assert_eq!(snapshot["function"]["policy"], "use_latest", "{snapshot}");
    let mut args = vec!["call"];
    args.extend(target);
    args.extend([sid.as_str(), "steps", "--input", "{not json"]);
    let output = openprogram(&args);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(serve.stop().success());
}

/// I-4: `send` starts a turn with a message (a new session when none is named) and follows
/// it until it stops running; `approve` and `deny` answer the approval it waits for, naming
/// that wait. A denied operation never runs.
#[test]
fn i4_send_then_approve_or_deny_against_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let serve = Serve::start(dir.path(), &["--token", "cli-admin"]);
    let url = serve.url.as_str();
    // `openprogram COMMAND --url URL --token cli-admin REST…`
    let cli = |command: &str, rest: &[&str]| {
        let mut args = vec![command, "--url", url, "--token", "cli-admin"];
        args.extend_from_slice(rest);
        openprogram(&args)
    };
    let script =
        json!([{"ask": "may I?"}, {"tool": "echo", "args": {"text": "ran"}}, {"reply": "done"}])
            .to_string();
    let send = || {
        let output = cli(
            "send",
            &["hello", "--script", &script, "--follow", "--json"],
        );
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let reply: Value = serde_json::from_slice(&output.stdout).expect("JSON");
        assert_eq!(reply["snapshot"]["state"], "waiting", "{reply}");
        let session = reply["session_id"]
            .as_str()
            .expect("a new session")
            .to_owned();
        let execution = reply["started"]["execution_id"]
            .as_str()
            .expect("an execution");
        (session, execution.to_owned())
    };
    for (verb, ran) in [("approve", true), ("deny", false)] {
        let (session, execution) = send();
        // `inspect` says what it waits for, in words, and the controls as `ctl` spells them.
        let shown = cli("inspect", &["execution", &session, &execution]).stdout;
        let shown = String::from_utf8_lossy(&shown).to_string();
        assert!(
            shown.contains("waiting — for a person: approval \"may I?\""),
            "{shown}"
        );
        assert!(
            shown.contains("controls") && shown.contains("set-policy"),
            "{shown}"
        );
        let output = cli(verb, &[&session, &execution]);
        assert!(
            output.status.success(),
            "{verb}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let said = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(
            said.starts_with(if ran { "approved " } else { "denied " }),
            "{said}"
        );
        let path = format!("/v1/sessions/{session}/executions/{execution}");
        let mut done = Value::Null;
        wait_until("the turn ends", || {
            done = call_raw(url, "GET", &path, Some("cli-admin"), None).1;
            done["state"] == "completed"
        });
        assert_eq!(done["text"], "done");
        let echoed = done["receipts"]
            .as_array()
            .expect("receipts")
            .iter()
            .any(|r| r["tool"] == "echo");
        assert_eq!(echoed, ran, "{verb}: {done}");
        let shown =
            String::from_utf8_lossy(&cli("inspect", &["execution", &execution]).stdout).to_string();
        assert!(
            shown.contains(&session) && shown.contains("completed"),
            "{shown}"
        );
        // `ctl` too: found, and refused for what it is (ended), not for a missing session.
        let refused =
            String::from_utf8_lossy(&cli("ctl", &["pause", &execution]).stderr).to_string();
        assert!(refused.contains("not_available"), "{refused}");
        // Nothing waits any more: a second decision is refused, with a reason.
        let again = cli(verb, &[&session, &execution]);
        assert_eq!(again.status.code(), Some(1), "{again:?}");
    }
}

/// I-4: README's tour runs as written: the `sh` block after "In another terminal", against
/// `serve` on a free port, from a directory holding its `openprogram-data`, with
/// `openprogram` on the PATH.
#[test]
fn i4_the_readme_tour_runs_as_written() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let after = readme
        .split_once("In another terminal")
        .expect("the tour's terminal")
        .1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("its sh block")
        .0;
    assert!(block.contains("openprogram send"), "{block}");
    let dir = tempfile::tempdir().expect("tempdir");
    let serve = Serve::start(&dir.path().join("openprogram-data"), &[]);
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_openprogram"), bin.join("openprogram"))
        .expect("link");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = Command::new("bash")
        .args(["-euo", "pipefail", "-c", block])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("OPENPROGRAM_URL", &serve.url)
        .env_remove("OPENPROGRAM_TOKEN")
        .output()
        .expect("bash");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{block}\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("waiting — for a person: approval \"ok?\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("approved ") && stdout.contains("completed: done"),
        "{stdout}"
    );
    assert!(stdout.contains("retry applied"), "{stdout}");
}

/// I-1: README's embedding snippet is the compiled example's own lines (`examples/embed.rs`
/// between its "README: begin" and "README: end" marks), so it compiles as shown.
#[test]
fn i1_the_readme_embedding_snippet_is_the_compiled_examples() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README");
    let example = std::fs::read_to_string(format!("{root}/examples/embed.rs")).expect("example");
    let region = example
        .split_once("// README: begin")
        .and_then(|(_, rest)| rest.split_once('\n'))
        .and_then(|(_, rest)| rest.split_once("// README: end"))
        .expect("the example's marks")
        .0;
    let from_example: Vec<&str> = region
        .trim_end()
        .lines()
        .map(|line| line.strip_prefix("    ").unwrap_or(line))
        .collect();
    let shown = readme
        .split_once("From [examples/embed.rs]")
        .and_then(|(_, rest)| rest.split_once("```rust\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("README's snippet")
        .0;
    let shown: Vec<&str> = shown.trim_end().lines().collect();
    assert!(shown.len() > 10, "{shown:?}");
    assert_eq!(
        shown, from_example,
        "README's snippet and examples/embed.rs differ"
    );
}
