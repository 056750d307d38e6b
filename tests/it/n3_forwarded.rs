//! N-3: a command sent to a node that does not run its execution is forwarded to the node
//! that does, over `openprogram cluster`'s three real nodes on one PostgreSQL. It is decided
//! there once: the same command sent to the owner and to the other node answers the same
//! status and body, and the execution's events name it once. A forwarded request that
//! reaches a node which does not run the execution (its owner changed on the way, or a
//! client set the header) is refused `owner_moved` and stores nothing.

use std::process::{Child, Command, Stdio};

use openprogram::storage::CommandId;
use serde_json::{json, Value};

const TOKEN: &str = "forwarded-commands-token";

/// `openprogram cluster --nodes N`, stopped (SIGTERM: nodes, then the database) when dropped.
struct Cluster {
    child: Child,
    urls: Vec<String>,
}

impl Cluster {
    fn start(nodes: usize, dir: &std::path::Path) -> Self {
        use std::io::BufRead as _;
        let mut child = Command::new(env!("CARGO_BIN_EXE_openprogram"))
            .args(["cluster", "--nodes", &nodes.to_string(), "--token", TOKEN])
            .arg("--dir")
            .arg(dir.join("cluster"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn cluster");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the cluster's line");
        // Stopped when dropped from here on, also if its line is not what is expected.
        let mut cluster = Cluster {
            child,
            urls: Vec::new(),
        };
        let described: Value = serde_json::from_str(&line).expect("one JSON line");
        let urls = described["nodes"].as_array().expect("nodes").iter();
        cluster.urls = urls
            .map(|node| node["url"].as_str().expect("url").to_owned())
            .collect();
        cluster
    }

    /// `method path` on node `index` (0-based) with the admin token.
    fn call(&self, index: usize, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let body = body.map(Value::to_string);
        crate::http::call_raw(&self.urls[index], method, path, Some(TOKEN), body)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let _ = self.child.wait();
    }
}

/// The types of the events of the execution at `path` that name `command_id` (`Null`: those
/// that name no command).
fn naming(cluster: &Cluster, path: &str, command_id: &Value) -> Vec<String> {
    let (status, events) = cluster.call(2, "GET", &format!("{path}/events?limit=1000"), None);
    assert_eq!(status, 200, "{events}");
    events
        .as_array()
        .expect("a list of events")
        .iter()
        .filter(|event| event["command_id"] == *command_id)
        .map(|event| event["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
fn n3_a_command_sent_to_any_node_is_decided_once_by_the_node_that_runs_it() {
    crate::pg_cluster::database();
    let dir = tempfile::tempdir().expect("temp dir");
    let cluster = Cluster::start(3, dir.path());
    let (status, session) = cluster.call(0, "POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(status, 201, "{session}");
    let session = session["session_id"].as_str().expect("session").to_owned();
    let script = json!([{"tool": "sleep", "args": {"ms": 60_000}}, {"reply": "done"}]);
    let start = json!({"kind": "agent", "message": "hold", "script": script});
    let executions = format!("/v1/sessions/{session}/executions");
    let (status, started) = cluster.call(0, "POST", &executions, Some(&start));
    assert_eq!(status, 201, "{started}");
    let path = format!(
        "{executions}/{}",
        started["execution_id"].as_str().expect("id")
    );
    // The first node runs it once it is running (its attempt owns it).
    let deadline = std::time::Instant::now() + crate::support::DEADLINE;
    while cluster.call(2, "GET", &path, None).1["state"] != "running" {
        assert!(std::time::Instant::now() < deadline, "never ran");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let commands = format!("{path}/commands");
    let pause = json!({"command_id": CommandId::new(), "kind": "pause"});
    let forwarded = cluster.call(1, "POST", &commands, Some(&pause));
    assert_eq!(forwarded.0, 202, "{}", forwarded.1);
    let named = naming(&cluster, &path, &pause["command_id"]);
    assert!(named.contains(&"control_applied".to_owned()), "{named:?}");
    // The same command again, at the owner and through the third node: the same answer,
    // and nothing more written.
    assert_eq!(cluster.call(0, "POST", &commands, Some(&pause)), forwarded);
    assert_eq!(cluster.call(2, "POST", &commands, Some(&pause)), forwarded);
    assert_eq!(naming(&cluster, &path, &pause["command_id"]), named);
    let mut unique = named.clone();
    unique.dedup();
    assert_eq!(
        unique.len(),
        named.len(),
        "a command applied twice: {named:?}"
    );

    // A forwarded request at a node that does not run the execution: refused, not decided.
    let cancel = json!({"command_id": CommandId::new(), "kind": "cancel"});
    let url = format!("{}{commands}", cluster.urls[1]);
    let refused = ureq::post(&url)
        .set("Authorization", &format!("Bearer {TOKEN}"))
        .set("X-OpenProgram-Forwarded", "n3")
        .send_string(&cancel.to_string());
    let Err(ureq::Error::Status(status, response)) = refused else {
        panic!("a forwarded command at a node that does not run it was accepted");
    };
    let body: Value = serde_json::from_str(&response.into_string().expect("body")).expect("json");
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("owner_moved")),
        "{body}"
    );
    let cancel_id = cancel["command_id"].as_str().expect("id");
    let (status, _) = cluster.call(
        1,
        "GET",
        &format!("/v1/sessions/{session}/commands/{cancel_id}"),
        None,
    );
    assert_eq!(status, 404, "a refused forward stored its command");
    assert!(naming(&cluster, &path, &cancel["command_id"]).is_empty());

    // Sent without the header, the same command is forwarded and ends the execution.
    assert_eq!(cluster.call(1, "POST", &commands, Some(&cancel)).0, 202);
    while cluster.call(2, "GET", &path, None).1["state"] != "cancelled" {
        assert!(std::time::Instant::now() < deadline, "never cancelled");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
