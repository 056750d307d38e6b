//! The start body's script over HTTP (SPEC §6, E-6): each element is kept as the text the
//! client sent, and one the scripted provider cannot read fails the run when it is taken.

use serde_json::Value;

use crate::http::{call_raw, TestServer};

/// An element is stored as sent (spacing included: the Admitted event's input carries its
/// text), and an element naming a key twice is not merged: the run fails at that decision
/// with a model error (E-6), after the step before it ran.
#[test]
fn e6_a_script_element_is_kept_as_sent_and_an_unreadable_one_fails_the_run() {
    let server = TestServer::new();
    let session = server.session();
    let path = format!("/v1/sessions/{}/executions", session.0);
    let echo = r#"{"tool" : "echo",  "args": {"text": "x"}}"#;
    let body =
        format!(r#"{{"message": "hi", "script": [ {echo} , {{"reply": "a", "reply": "b"}} ]}}"#);
    let (status, started) = call_raw(&server.url, "POST", &path, Some(&session.1), Some(body));
    assert_eq!(status, 201, "{started}");
    let execution = started["execution_id"].as_str().expect("execution_id");
    let failed = server.wait_state(&session, execution, "failed");
    let text = failed["text"].as_str().unwrap_or_default();
    assert!(text.contains("unrecognized script element"), "{failed}");
    let receipts = failed["receipts"].as_array().expect("receipts");
    assert!(
        receipts
            .iter()
            .any(|receipt| receipt["tool"] == "echo" && receipt["status"] == "confirmed"),
        "{failed}"
    );
    let events = format!("{path}/{execution}/events?after=0");
    let (status, events) = server.call("GET", &events, Some(&session.1), None);
    assert_eq!(status, 200, "{events}");
    let admitted = &events[0];
    assert_eq!(admitted["type"], "admitted", "{admitted}");
    let input = admitted["input"].as_str().expect("the input as text");
    assert!(input.contains(echo), "{input}");
    let _: Value = serde_json::from_str(input).expect("the stored input is JSON");
}
