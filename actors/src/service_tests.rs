//! Tests of the command service (`service.rs`): an admission's state against a replay of
//! it (R-5), and a start body's script kept as sent.

use super::*;
use crate::rebuild::load;
use openprogram_storage::{RevisionId, Store};
use serde_json::json;

/// R-5: the head and machine an admission hands to its actor are exactly those a
/// replay of the stored admission rebuilds after a restart (the store is reopened), for
/// inputs that do not round-trip trivially (floats, escapes, unicode), one stored as a
/// blob (S-5: over 1 KiB), and defaults (no parent, no iteration limit).
#[tokio::test]
async fn r5_an_admission_starts_from_the_state_a_restart_replays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let long = "x".repeat(2048);
    let mut admitted = Vec::new();
    // A script as a client's body carries it, element texts kept as sent.
    let from_body: StartRequest = serde_json::from_str(START_BODY).expect("a start body");
    {
        let store = Store::open(dir.path()).expect("store");
        for (start_paused, parent, max_iterations, text) in [
            (false, Some(MessageId::new()), Some(7), Some("a\u{1F600}")),
            (true, Some(MessageId::new()), Some(7), Some("a\u{1F600}")),
            (false, None, None, Some(long.as_str())),
            // The body's own request: its message, script and defaults.
            (false, None, None, None),
        ] {
            let request = if let Some(text) = text {
                let args = json!({"text": text, "n": 0.1, "big": u64::MAX});
                let extra = json!([1, -2, 3.5e300, null, {"z": 1, "a": 2}]);
                StartRequest {
                    message: "héllo \"quoted\"\n".into(),
                    parent_message_id: parent,
                    script: vec![
                        json!({"tool": "echo", "args": args}).into(),
                        json!({"reply": "done", "extra": extra}).into(),
                    ],
                    max_iterations,
                    start_paused,
                    job: None,
                    when_busy: None,
                    restart_window: None,
                }
            } else {
                from_body.clone()
            };
            let admission = Admission::new(
                ExecutionId::new(),
                SessionId::new(),
                RevisionId::new(),
                request,
                ExecutionKind::AgentTurn,
            )
            .expect("admission");
            let execution_id = admission.head.execution_id;
            let (head, machine, version) = admission.commit(&store).await.expect("commit");
            assert_eq!(version, 1);
            admitted.push((execution_id, head, machine, start_paused));
        }
    }
    let store = Store::open(dir.path()).expect("reopen");
    for (execution_id, head, machine, start_paused) in admitted {
        let (stored_head, replayed) = load(&store, execution_id).expect("load");
        assert_eq!(head, stored_head, "start_paused: {start_paused}");
        assert_eq!(machine, replayed, "start_paused: {start_paused}");
    }
}

const START_BODY: &str = r#"{"message": "m", "script": [ {"reply" : "done", "a": [1, 2.50]} ,
    {"tool":"echo","args":{"text":"y", "n": 1e2}} ]}"#;

/// SPEC §6 (`POST …/executions`): a script element is kept as the JSON text the client
/// sent (whitespace, number forms and key order included), not rewritten.
#[test]
fn e1_a_start_body_keeps_each_script_element_as_its_text() {
    let request: StartRequest = serde_json::from_str(START_BODY).expect("a start body");
    let texts: Vec<&str> = request.script.iter().map(ScriptElement::text).collect();
    assert_eq!(
        texts,
        [
            r#"{"reply" : "done", "a": [1, 2.50]}"#,
            r#"{"tool":"echo","args":{"text":"y", "n": 1e2}}"#
        ]
    );
    // An embedder holding the text gets the same element.
    let from_text = ScriptElement::from_text(r#"{"reply" : "done", "a": [1, 2.50]}"#);
    assert_eq!(from_text.ok().as_ref(), request.script.first());
    assert!(ScriptElement::from_text("{not json").is_err());
}
