//! Issue 36's CLI over many executions, against a server in this process: `inspect
//! executions` across sessions (needs attention first, filters, any id), `ctl --where` with
//! and without `--dry-run`, and `inspect tail` following the global log.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

use crate::http::{TestServer, ADMIN};

fn openprogram(server: &TestServer, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args(args)
        .args(["--url", &server.url, "--token", ADMIN])
        .output()
        .expect("run openprogram")
}

fn json_of(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// A turn that stops at an approval (`waiting`) until answered or declined.
fn asking() -> Value {
    json!({"message": "Please deploy the site", "script": [{"ask": "go?"}, {"tool": "echo", "args": {"text": "x"}}, {"reply": "done"}]})
}

fn done() -> Value {
    json!({"message": DONE, "script": [{"tool": "echo", "args": {"text": "x"}}, {"reply": "done"}]})
}

/// A message longer than a row shows: a word past its first 120 characters still finds it.
const DONE: &str =
    "Summarise the week's incident reports for the on-call rotation, group them by service, \
     and end with the one that mentions a zebra";

fn ids(rows: &Value) -> Vec<String> {
    rows.as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| row["execution_id"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn i4_inspect_executions_across_sessions_needs_attention_first() {
    let server = TestServer::new();
    let (first, second) = (server.session(), server.session());
    let mut finished = Vec::new();
    for _ in 0..2 {
        let started = server.start(&first, done());
        finished.push(started["execution_id"].as_str().expect("id").to_owned());
    }
    let waiting = server.start(&second, asking());
    let waiting = waiting["execution_id"].as_str().expect("id").to_owned();
    for execution in &finished {
        server.wait_state(&first, execution, "completed");
    }
    server.wait_state(&second, &waiting, "waiting");

    let all = json_of(&openprogram(&server, &["inspect", "executions", "--json"]));
    assert_eq!(ids(&all).len(), 3, "{all}");
    assert_eq!(ids(&all)[0], waiting, "needs attention first: {all}");
    assert_eq!(all[0]["needs_attention"], true);
    assert_eq!(all[1]["needs_attention"], false);
    let completed = json_of(&openprogram(
        &server,
        &["inspect", "executions", "--state", "completed", "--json"],
    ));
    assert_eq!(ids(&completed).len(), 2);
    assert!(finished.iter().all(|id| ids(&completed).contains(id)));
    let by_session = json_of(&openprogram(
        &server,
        &["inspect", "executions", "--id", &second.0, "--json"],
    ));
    assert_eq!(ids(&by_session), vec![waiting.clone()]);
    let by_wait = server.snapshot(&second, &waiting);
    let wait_id = by_wait["waits"][0]["wait_id"].as_str().expect("wait id");
    let found = json_of(&openprogram(
        &server,
        &["inspect", "executions", "--id", wait_id, "--json"],
    ));
    assert_eq!(ids(&found), vec![waiting.clone()], "found by its wait's id");
    let recent = json_of(&openprogram(
        &server,
        &[
            "inspect",
            "executions",
            "--since",
            "1h",
            "--limit",
            "1",
            "--json",
        ],
    ));
    assert_eq!(ids(&recent), vec![waiting.clone()]);
    // Each row says what it was asked; the words of it find it, in any case.
    assert_eq!(all[0]["request"], "Please deploy the site", "{all}");
    let shown: String = DONE.chars().take(120).collect();
    assert_eq!(
        all[1]["request"],
        shown.as_str(),
        "a row shows the first 120 characters"
    );
    let (_, zebra) = server.call("GET", "/debug/overview?text=zebra", Some(ADMIN), None);
    let mut found = ids(&zebra["executions"]);
    found.sort();
    let mut expected = finished.clone();
    expected.sort();
    assert_eq!(
        found, expected,
        "found by a word past what a row shows: {zebra}"
    );
    let by_cli = json_of(&openprogram(
        &server,
        &["inspect", "executions", "--text", "DEPLOY the", "--json"],
    ));
    assert_eq!(
        ids(&by_cli),
        vec![waiting.clone()],
        "the CLI finds by words too"
    );
    let (status, by_words) = server.call(
        "GET",
        "/debug/overview?text=DEPLOY%20the",
        Some(ADMIN),
        None,
    );
    assert_eq!(status, 200, "{by_words}");
    assert_eq!(
        ids(&by_words["executions"]),
        vec![waiting.clone()],
        "{by_words}"
    );
    let (_, none) = server.call("GET", "/debug/overview?text=undeploy", Some(ADMIN), None);
    assert_eq!(ids(&none["executions"]), Vec::<String>::new(), "{none}");
    let table = openprogram(&server, &["inspect", "executions", "--state", "waiting"]);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(
        table.contains(&waiting) && table.contains("needs attention"),
        "{table}"
    );
    assert!(
        table.contains("Please deploy the site"),
        "what it was asked: {table}"
    );
    // Bad input: a clear error, exit 2 for the CLI's own flags, 400 from the API.
    let bad = openprogram(&server, &["inspect", "executions", "--since", "soon"]);
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid duration"));
    let (status, body) = server.call("GET", "/debug/overview?colour=red", Some(ADMIN), None);
    assert_eq!(status, 400, "{body}");
    let (status, _) = server.call("GET", "/debug/overview?state=sleepy", Some(ADMIN), None);
    assert_eq!(status, 400);
    let (status, _) = server.call("GET", "/debug/overview", Some(&second.1), None);
    assert_eq!(status, 401, "an admin read");
}

#[test]
fn i4_ctl_where_lists_with_dry_run_then_sends_each_fenced() {
    let server = TestServer::new();
    // Each turn in a session of its own: a session's turns run one at a time (C-2).
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let session = server.session();
        let started = server.start(&session, asking());
        waiting.push((
            session,
            started["execution_id"].as_str().expect("id").to_owned(),
        ));
    }
    let session = server.session();
    let other = server.start(&session, done());
    let other = other["execution_id"].as_str().expect("id").to_owned();
    for (session, execution) in &waiting {
        server.wait_state(session, execution, "waiting");
    }
    server.wait_state(&session, &other, "completed");
    let dry = openprogram(
        &server,
        &["ctl", "decline", "--where", "state=waiting", "--dry-run"],
    );
    let listed = String::from_utf8_lossy(&dry.stdout).into_owned();
    assert!(dry.status.success(), "{dry:?}");
    assert!(
        waiting.iter().all(|(_, id)| listed.contains(id)),
        "{listed}"
    );
    assert!(!listed.contains(&other), "{listed}");
    assert!(
        listed.contains("2 executions selected; nothing sent"),
        "{listed}"
    );
    for (session, execution) in &waiting {
        assert_eq!(server.snapshot(session, execution)["state"], "waiting");
    }
    // A selection that fills its limit says so.
    let capped = openprogram(
        &server,
        &[
            "ctl",
            "decline",
            "--where",
            "state=waiting",
            "--dry-run",
            "--limit",
            "1",
        ],
    );
    let capped = String::from_utf8_lossy(&capped.stdout).into_owned();
    assert!(
        capped.contains("the selection stopped at 1 executions"),
        "{capped}"
    );
    assert!(
        capped.contains("1 executions selected; nothing sent"),
        "{capped}"
    );
    let sent = openprogram(&server, &["ctl", "decline", "--where", "state=waiting"]);
    let replies = String::from_utf8_lossy(&sent.stdout).into_owned();
    assert!(
        sent.status.success(),
        "{replies} {}",
        String::from_utf8_lossy(&sent.stderr)
    );
    assert_eq!(replies.matches("decline applied").count(), 2, "{replies}");
    for (session, execution) in &waiting {
        server.wait_state(session, execution, "completed");
    }
    // Nothing selected now; bad clauses are usage errors.
    let none = openprogram(
        &server,
        &["ctl", "cancel", "--where", "state=waiting", "--dry-run"],
    );
    assert!(String::from_utf8_lossy(&none.stdout).contains("0 executions selected"));
    let bad = openprogram(&server, &["ctl", "cancel", "--where", "colour=red"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let both = openprogram(
        &server,
        &["ctl", "cancel", "--where", "state=paused", &session.0],
    );
    assert_eq!(
        both.status.code(),
        Some(2),
        "--where or ids, not both: {both:?}"
    );
}

#[test]
fn i4_inspect_tail_follows_the_global_log() {
    let server = TestServer::new();
    let session = server.session();
    let first = server.start(&session, done());
    let first = first["execution_id"].as_str().expect("id").to_owned();
    server.wait_state(&session, &first, "completed");
    let mut tail = Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args(["inspect", "tail", "--after", "0"])
        .args(["--url", &server.url, "--token", ADMIN])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the tail");
    let mut lines = BufReader::new(tail.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    // The history first, then what happens while it follows.
    let mut second = None;
    loop {
        let line = lines.next().expect("a line").expect("utf-8");
        if second.is_none() && line.contains(&first) && line.ends_with("state_changed") {
            let started = server.start(&session, done());
            second = Some(started["execution_id"].as_str().expect("id").to_owned());
        }
        seen.push(line.clone());
        if let Some(second) = &second {
            if line.contains(second.as_str()) && line.ends_with("replied") {
                break;
            }
        }
    }
    tail.kill().expect("SIGKILL"); // by pid: the child this test started
    let _ = tail.wait();
    assert!(
        seen[0].contains(&first) && seen[0].ends_with("admitted"),
        "{seen:?}"
    );
    let positions: Vec<u64> = seen
        .iter()
        .filter_map(|line| line.split(' ').next()?.parse().ok())
        .collect();
    assert!(
        positions.windows(2).all(|pair| pair[0] < pair[1]),
        "{seen:?}"
    );
}

/// Jobs keep the kind of what they run (an agent turn here) and have a Job record: the
/// overview calls them jobs, so `inspect executions --kind job`, `ctl --where kind=job` and
/// the page's Kind filter (`/debug/overview?kind=job`) find them, and only them.
#[test]
fn i3_an_execution_admitted_as_a_job_is_found_by_kind_job() {
    let server = TestServer::on(
        tempfile::tempdir().expect("tempdir"),
        |builder| builder.resource("model", 1),
        |_| {},
    );
    let session = server.session();
    let agent = server.start(&session, done());
    let agent = agent["execution_id"].as_str().expect("id").to_owned();
    let mut job = done();
    job["job"] = json!({"resources": {"model": 1}});
    let job = server.start(&session, job);
    let job = job["execution_id"].as_str().expect("id").to_owned();
    server.wait_state(&session, &agent, "completed");
    server.wait_state(&session, &job, "completed");

    let jobs = json_of(&openprogram(
        &server,
        &["inspect", "executions", "--kind", "job", "--json"],
    ));
    assert_eq!(ids(&jobs), vec![job.clone()], "{jobs}");
    assert_eq!(jobs[0]["kind"], "job");
    let agents = json_of(&openprogram(
        &server,
        &["inspect", "executions", "--kind", "agent", "--json"],
    ));
    assert_eq!(ids(&agents), vec![agent.clone()], "{agents}");
    let dry = openprogram(
        &server,
        &["ctl", "cancel", "--where", "kind=job", "--dry-run"],
    );
    let listed = String::from_utf8_lossy(&dry.stdout).into_owned();
    assert!(dry.status.success(), "{dry:?}");
    assert!(
        listed.contains(&job) && !listed.contains(&agent),
        "{listed}"
    );
    let (status, page) = server.call("GET", "/debug/overview?kind=job", Some(ADMIN), None);
    assert_eq!(status, 200, "{page}");
    assert_eq!(ids(&page["executions"]), vec![job], "{page}");
}
