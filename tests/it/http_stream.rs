//! I-2: an execution's event stream follows it as its actor commits on this node, without
//! waiting for a read of the store: with the idle poll set to an hour, every event of a turn
//! of several steps still arrives, in order, each once.

use std::io::BufRead as _;
use std::time::Duration;

use serde_json::{json, Value};

use crate::http::TestServer;

#[test]
fn i2_a_stream_follows_its_execution_as_it_commits_without_polling_the_store() {
    let server = TestServer::with(|api| api.poll = Duration::from_secs(3600));
    let session = server.session();
    let mut script = Vec::new();
    for step in 0..5 {
        script.push(json!({"tool": "echo", "args": {"text": format!("step {step}")}}));
        script.push(json!({"tool": "sleep", "args": {"ms": 30}}));
    }
    script.push(json!({"reply": "done"}));
    let started = server.start(&session, json!({"message": "m", "script": script}));
    let execution = started["execution_id"].as_str().expect("execution id");
    let mut reader = server.events_stream(&session, execution);
    let (mut ids, mut last) = (Vec::new(), Value::Null);
    while last["type"] != "replied" {
        let mut line = String::new();
        let read = reader.read_line(&mut line);
        assert!(
            read.is_ok_and(|read| read > 0),
            "the stream stopped at {ids:?}, last {last}"
        );
        if let Some(id) = line.trim_end().strip_prefix("id: ") {
            ids.push(id.parse::<u64>().expect("a seq"));
        } else if let Some(data) = line.trim_end().strip_prefix("data: ") {
            last = serde_json::from_str(data).expect("JSON");
        }
    }
    let expected: Vec<u64> = (1..=ids.len() as u64).collect();
    assert_eq!(ids, expected, "every event once, in order");
    assert!(ids.len() > 20, "a turn of 5 steps: {ids:?}");
}
