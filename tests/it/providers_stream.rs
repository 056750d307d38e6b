//! E-3 with a real provider: a streamed response's pieces reach watchers as they arrive —
//! the library's `Runtime::deltas` and the HTTP event stream — while only the whole response
//! is recorded; and K-2: a Pause sent while the response streams stops at the next safe point.

use std::io::BufRead as _;
use std::sync::Arc;

use openprogram::providers::{Api, HttpProvider};
use openprogram::storage::Event;
use openprogram::{Delta, DeltaKind};
use serde_json::{json, Value};

use crate::model_stub::{openai_text_frames, openai_tool_call_frames, Reply, Stub};
use crate::providers::{config, Turn};
use crate::support::{command_of, wait_state, DEADLINE};

/// The text the pieces make, laid at their offsets (a piece at offset 0 starts again).
fn assemble(pieces: &[Arc<Delta>]) -> String {
    let mut text = String::new();
    for piece in pieces.iter().filter(|piece| piece.kind == DeltaKind::Text) {
        text.truncate(piece.offset as usize);
        text.push_str(&piece.text);
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e3_streamed_text_reaches_a_watcher_as_it_arrives_and_only_the_whole_is_recorded() {
    let stub = Stub::start(vec![Reply::Gated {
        frames: openai_text_frames(&["Hello, ", "streamed ", "world."]),
    }]);
    let turn = Turn::open(config(Api::OpenAi, &stub, true));
    let execution = turn.start("hi").await;
    stub.wait_requests(1);
    let mut watcher = turn.runtime.deltas(turn.session, execution).expect("watch");
    stub.open_gate();
    let mut pieces = Vec::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while assemble(&pieces) != "Hello, streamed world." {
        let piece = tokio::time::timeout_at(deadline, watcher.recv())
            .await
            .expect("the pieces arrive")
            .expect("a piece");
        pieces.push(piece);
    }
    let offsets: Vec<u64> = pieces.iter().map(|piece| piece.offset).collect();
    assert_eq!(offsets, vec![0, 7, 16]);
    let snapshot = wait_state(&turn.runtime, turn.session, execution, "completed").await;
    assert_eq!(snapshot.text, "Hello, streamed world.");
    // The pieces name the decision they previewed.
    let events = turn
        .runtime
        .events(turn.session, execution, 0)
        .expect("events");
    let decided = events
        .iter()
        .find_map(|envelope| match &envelope.event {
            Event::ModelDecided { effect_id, .. } => Some(*effect_id),
            _ => None,
        })
        .expect("a decision");
    assert!(pieces.iter().all(|piece| piece.effect_id == decided));
    turn.runtime.shutdown().await;
}

#[test]
fn e3_the_event_stream_sends_the_pieces_before_the_decision() {
    let stub = Stub::start(vec![Reply::Gated {
        frames: openai_text_frames(&["Piece ", "by ", "piece."]),
    }]);
    let provider = HttpProvider::new(config(Api::OpenAi, &stub, true)).expect("provider");
    let server = crate::http::TestServer::on(
        tempfile::tempdir().expect("tempdir"),
        |builder| builder.provider(Arc::new(provider)),
        |_| {},
    );
    let session = server.session();
    let started = server.start(&session, json!({"message": "hi"}));
    let execution = started["execution_id"].as_str().expect("execution id");
    stub.wait_requests(1);
    let mut reader = server.events_stream(&session, execution);
    // The stream watches from its start: the gate opens once it answered.
    stub.open_gate();
    let mut frames: Vec<(Option<String>, Value)> = Vec::new();
    let (mut event, mut has_id) = (None, false);
    loop {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).expect("read") > 0,
            "stream ended"
        );
        let line = line.trim_end();
        if line.starts_with("id: ") {
            has_id = true;
        } else if let Some(name) = line.strip_prefix("event: ") {
            event = Some(name.to_owned());
        } else if let Some(data) = line.strip_prefix("data: ") {
            let data: Value = serde_json::from_str(data).expect("JSON");
            // Pieces are not stored: they carry no id, so they move no cursor.
            assert_eq!(has_id, event.is_none(), "{event:?} {data}");
            frames.push((event.take(), data));
            has_id = false;
        }
        if frames
            .last()
            .is_some_and(|(_, data)| data["type"] == "replied")
        {
            break;
        }
    }
    let decided = frames
        .iter()
        .position(|(_, data)| data["type"] == "model_decided")
        .expect("the decision's event");
    let pieces: Vec<&Value> = frames
        .iter()
        .filter(|(event, _)| event.as_deref() == Some("delta"))
        .map(|(_, data)| data)
        .collect();
    let texts: Vec<&str> = pieces
        .iter()
        .filter_map(|data| data["text"].as_str())
        .collect();
    assert_eq!(texts, vec!["Piece ", "by ", "piece."], "{frames:?}");
    assert!(pieces
        .iter()
        .all(|data| data["kind"] == "text" && data["effect_id"] == frames[decided].1["effect_id"]));
    let last_piece = frames
        .iter()
        .rposition(|(event, _)| event.as_deref() == Some("delta"))
        .expect("pieces");
    assert!(
        last_piece < decided,
        "the pieces come before the decision: {frames:?}"
    );
}

/// K-2: a Pause that arrives while the model's response streams in stops the turn at the next
/// safe point: the whole decision is recorded (not asked for again) and its tool call waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2_a_pause_during_a_stream_stops_at_the_next_safe_point() {
    let stub = Stub::start(vec![
        Reply::Gated {
            frames: openai_tool_call_frames("echo", r#"{"text":"later"}"#),
        },
        Reply::Stream {
            frames: openai_text_frames(&["Echoed."]),
            cut: false,
        },
    ]);
    let turn = Turn::open(config(Api::OpenAi, &stub, true));
    let execution = turn.start("echo later").await;
    stub.wait_requests(1);
    let command = |kind: &str| command_of(json!({"kind": kind}));
    let paused = turn
        .runtime
        .command(turn.session, execution, command("pause"))
        .await
        .expect("pause");
    assert!(
        matches!(paused.status, "applied" | "accepted"),
        "{paused:?}"
    );
    stub.open_gate();
    let snapshot = wait_state(&turn.runtime, turn.session, execution, "paused").await;
    let tools: Vec<(&str, &str)> = snapshot
        .receipts
        .iter()
        .map(|receipt| (receipt.tool.as_str(), receipt.status))
        .collect();
    assert_eq!(tools, vec![("model", "confirmed")], "the echo waits");
    let resumed = turn
        .runtime
        .command(turn.session, execution, command("continue"))
        .await
        .expect("continue");
    assert_eq!(resumed.status, "applied", "{resumed:?}");
    let done = wait_state(&turn.runtime, turn.session, execution, "completed").await;
    assert_eq!(done.text, "Echoed.");
    assert_eq!(
        stub.requests().len(),
        2,
        "the paused decision was kept, not asked again"
    );
    turn.runtime.shutdown().await;
}
