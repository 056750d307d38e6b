//! Tests of the scripted provider's reading of its script elements (`script.rs`).

use super::*;
use serde_json::json;

#[test]
fn e3_a_script_element_becomes_the_decision_it_names() {
    let tool = json!({"tool": "echo", "args": {"text": "hi"}, "note": 1});
    assert_eq!(
        scripted_decision(&tool.to_string()),
        Ok(Decision::tool("echo".into(), json!({"text": "hi"}).into()))
    );
    assert_eq!(
        scripted_decision(&json!({"tool": "echo"}).to_string()),
        Ok(Decision::tool("echo".into(), json!({}).into()))
    );
    // A `tool` that is not a name is no tool call; the element may still reply.
    assert_eq!(
        scripted_decision(&json!({"tool": 7, "reply": "done"}).to_string()),
        Ok(Decision::reply("done".into()))
    );
    assert_eq!(
        scripted_decision(&json!({"ask": "ok?"}).to_string()),
        Ok(Decision::Ask {
            prompt: "ok?".into(),
            wait: None,
        })
    );
    assert_eq!(
        scripted_decision(&json!({"tool": 7}).to_string()),
        Err(r#"unrecognized script element {"tool":7}"#.into())
    );
    assert_eq!(
        scripted_decision(&json!("reply").to_string()),
        Err(r#"unrecognized script element "reply""#.into())
    );
    // `null` arguments are passed as `null`; an array is no element.
    assert_eq!(
        scripted_decision(r#"{"tool":"echo","args":null}"#),
        Ok(Decision::tool(
            "echo".into(),
            serde_json::Value::Null.into()
        ))
    );
    assert_eq!(
        scripted_decision(r#"["echo",{"text":"hi"}]"#),
        Err(r#"unrecognized script element ["echo",{"text":"hi"}]"#.into())
    );
    assert_eq!(
        scripted_decision(r#"{"reply":"a","reply":"b"}"#),
        Err(r#"unrecognized script element {"reply":"a","reply":"b"}"#.into())
    );
}
