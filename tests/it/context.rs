//! E-8 through the library with the scripted provider, whose `{"digest": true}` element
//! replies with the conversation its request carried: a turn sees the earlier turns of its
//! branch in order (user message, tool call, result, reply) and no other branch's; a fork
//! sees the path to its fork point; a compaction's summary stands in for the turns it
//! replaced; a steer stands where it arrived; the branch is fixed in the turn's log; past
//! the context budget the compactor summarizes the branch, or the oldest turns are left out.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use openprogram::storage::{Event, ExecutionId, MessageId, SessionId};
use openprogram::{Compactor, Message, Runtime, StartRequest};
use serde_json::{json, Value};

use crate::support::*;

fn digest() -> Value {
    json!({"digest": true})
}

/// Summarizes as the number of messages it stands for.
struct Counting;

impl Compactor for Counting {
    fn summarize(
        &self,
        _session_id: SessionId,
        prefix: Vec<Message>,
    ) -> BoxFuture<'static, Result<String, String>> {
        futures::future::ready(Ok(format!("{} messages before", prefix.len()))).boxed()
    }
}

struct Conversation {
    runtime: Runtime,
    session: SessionId,
    _dir: tempfile::TempDir,
}

impl Conversation {
    fn open() -> Self {
        Self::with_budget(None, true)
    }

    /// With a context budget of `tokens`, and the `Counting` compactor if `compactor`.
    fn with_budget(tokens: Option<u64>, compactor: bool) -> Self {
        let dir = tempfile::tempdir().expect("dir");
        let mut builder = Runtime::builder().data_dir(dir.path());
        if compactor {
            builder = builder.compactor(Arc::new(Counting));
        }
        if let Some(tokens) = tokens {
            builder = builder.context_budget(tokens);
        }
        let runtime = builder.open().expect("open");
        Self {
            runtime,
            session: SessionId::new(),
            _dir: dir,
        }
    }

    /// Runs `message` answering `parent` with `script` to its end; its id, reply message id
    /// and text.
    async fn turn(
        &self,
        message: &str,
        parent: Option<MessageId>,
        script: Vec<Value>,
    ) -> (ExecutionId, MessageId, String) {
        let started = self
            .runtime
            .start_execution(
                self.session,
                StartRequest {
                    message: message.into(),
                    parent_message_id: parent,
                    script: elements(script),
                    ..Default::default()
                },
            )
            .await
            .expect("start");
        let done = wait_state(
            &self.runtime,
            self.session,
            started.execution_id,
            "completed",
        )
        .await;
        (started.execution_id, started.reply_message_id, done.text)
    }

    fn events(&self, execution: ExecutionId) -> Vec<Event> {
        self.runtime
            .events(self.session, execution, 0)
            .expect("events")
            .into_iter()
            .map(|envelope| envelope.event)
            .collect()
    }
}

#[tokio::test]
async fn e8_a_turn_sees_the_earlier_turns_of_its_branch_in_order_and_no_other() {
    let talk = Conversation::open();
    let (t1, t1_reply, _) = talk
        .turn(
            "find the largest file",
            None,
            vec![echo("a.log"), reply("a.log is the largest")],
        )
        .await;
    let (_, t2_reply, seen) = talk.turn("continue", Some(t1_reply), vec![digest()]).await;
    assert_eq!(
        seen,
        [
            "user: find the largest file",
            r#"assistant: call call00001 echo {"text":"a.log"}"#,
            "tool call00001: a.log",
            "assistant: a.log is the largest",
            "user: continue",
        ]
        .join("\n")
    );
    // Two turns on, still in order; a turn answering t1 again (another branch) sees t1 only.
    let (_, _, third) = talk.turn("and then", Some(t2_reply), vec![digest()]).await;
    assert!(
        third.starts_with("user: find the largest file\n")
            && third.contains("\nuser: continue\nassistant: user: find the largest file")
            && third.ends_with("\nuser: and then"),
        "{third}"
    );
    let (_, _, side) = talk.turn("instead", Some(t1_reply), vec![digest()]).await;
    assert!(
        !side.contains("continue")
            && side.ends_with("assistant: a.log is the largest\nuser: instead"),
        "{side}"
    );
    // A root turn writes nothing to fix; a turn with earlier turns fixes them once.
    let pinned = |execution| {
        talk.events(execution)
            .iter()
            .filter(|event| matches!(event, Event::ContextPinned { .. }))
            .count()
    };
    assert_eq!(pinned(t1), 0);
    let executions = talk
        .runtime
        .store()
        .executions_in_session(talk.session)
        .expect("executions");
    assert_eq!(
        executions
            .iter()
            .map(|execution| pinned(*execution))
            .sum::<usize>(),
        3
    );
}

#[tokio::test]
async fn e8_a_fork_sees_the_path_to_its_fork_point_and_not_what_followed() {
    let talk = Conversation::open();
    let (_, t1_reply, _) = talk.turn("one", None, vec![reply("first")]).await;
    let (t2, t2_reply, _) = talk
        .turn("two", Some(t1_reply), vec![echo("x"), digest()])
        .await;
    talk.turn("three", Some(t2_reply), vec![reply("third")])
        .await;
    let forked = talk
        .runtime
        .command(
            talk.session,
            t2,
            command_of(json!({"kind": "fork", "checkpoint": null})),
        )
        .await
        .expect("fork");
    let child = forked.execution_id.expect("a child");
    talk.runtime
        .command(talk.session, child, command_of(json!({"kind": "continue"})))
        .await
        .expect("continue");
    let done = wait_state(&talk.runtime, talk.session, child, "completed").await;
    assert_eq!(
        done.text,
        [
            "user: one",
            "assistant: first",
            "user: two",
            r#"assistant: call call00001 echo {"text":"x"}"#,
            "tool call00001: x",
        ]
        .join("\n"),
        "the fork saw what followed its fork point"
    );
}

#[tokio::test]
async fn e8_a_summary_stands_in_for_the_turns_it_replaced_on_its_branch_only() {
    let talk = Conversation::open();
    let (_, t1_reply, _) = talk.turn("one", None, vec![reply("first")]).await;
    let (_, t2_reply, _) = talk
        .turn("two", Some(t1_reply), vec![reply("second")])
        .await;
    talk.runtime
        .compact(talk.session, t2_reply)
        .await
        .expect("compact");
    let (_, _, seen) = talk.turn("three", Some(t2_reply), vec![digest()]).await;
    assert_eq!(
        seen,
        "user: [A summary of the conversation so far]\n4 messages before\nuser: three"
    );
    // A branch that leaves t2 out is not summarized.
    let (_, _, side) = talk.turn("aside", Some(t1_reply), vec![digest()]).await;
    assert_eq!(side, "user: one\nassistant: first\nuser: aside");
}

#[tokio::test]
async fn e8_a_steer_stands_where_it_arrived_not_after_the_newest_turn() {
    let harness = Harness::new();
    let execution = harness
        .start(vec![sleep(400), echo("after"), digest()], None)
        .await;
    harness.wait_for_sleep(execution).await;
    assert_eq!(
        harness
            .command(execution, "steer", Some("be brief"))
            .await
            .status,
        "applied"
    );
    let done = harness.wait_for_state(execution, "completed").await;
    let lines: Vec<&str> = done.text.lines().collect();
    let at = |needle: &str| {
        lines
            .iter()
            .position(|line| line.starts_with(needle))
            .unwrap_or_else(|| panic!("no {needle} in {lines:?}"))
    };
    // It arrived while the sleep ran: after the sleep's result, before the next call.
    assert!(at("tool call00001") < at("user: be brief"), "{lines:?}");
    assert!(
        at("user: be brief") < at("assistant: call call00002"),
        "{lines:?}"
    );
}

/// A reply of about `tokens` tokens by the runtime's estimate (four bytes each).
fn long_reply(word: &str, tokens: usize) -> Value {
    reply(&format!("{word} ").repeat(tokens * 4 / (word.len() + 1)))
}

#[tokio::test]
async fn e8_past_the_budget_the_compactor_summarizes_the_earlier_turns() {
    let talk = Conversation::with_budget(Some(100), true);
    let (_, t1_reply, _) = talk.turn("one", None, vec![long_reply("alpha", 120)]).await;
    let (t2, _, seen) = talk.turn("two", Some(t1_reply), vec![digest()]).await;
    assert_eq!(
        seen,
        "user: [A summary of the conversation so far]\n2 messages before\nuser: two"
    );
    let snapshot = talk
        .runtime
        .snapshot(talk.session, t2)
        .await
        .expect("snapshot");
    let context = snapshot.context.expect("a context");
    assert!(
        context.summary.is_some() && context.left_out == 0,
        "{context:?}"
    );
    // The summary is the session's compaction, shown on the transcript too.
    let view = talk.runtime.session(talk.session).expect("session");
    assert_eq!(view.compactions.len(), 1);
    assert_eq!(Some(view.compactions[0].message_id), context.summary);
}

#[tokio::test]
async fn e8_past_the_budget_without_a_compactor_the_oldest_turns_are_left_out_whole() {
    let talk = Conversation::with_budget(Some(150), false);
    let (_, t1_reply, _) = talk.turn("one", None, vec![long_reply("alpha", 100)]).await;
    let (_, t2_reply, _) = talk
        .turn("two", Some(t1_reply), vec![long_reply("beta", 100)])
        .await;
    let (t3, _, seen) = talk.turn("three", Some(t2_reply), vec![digest()]).await;
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(
        lines[0],
        "user: [1 earlier entries of this conversation are left out to fit the context budget.]"
    );
    assert!(
        !seen.contains("alpha") && !seen.contains("user: one"),
        "{seen}"
    );
    assert_eq!(lines[1], "user: two");
    assert!(lines[2].starts_with("assistant: beta beta"), "{seen}");
    assert_eq!(lines[3], "user: three");
    let snapshot = talk
        .runtime
        .snapshot(talk.session, t3)
        .await
        .expect("snapshot");
    let context = snapshot.context.expect("a context");
    assert_eq!((context.summary, context.left_out), (None, 1));
    // Without a budget the same conversation is carried whole.
    let whole = Conversation::open();
    let (_, t1_reply, _) = whole
        .turn("one", None, vec![long_reply("alpha", 100)])
        .await;
    let (_, _, seen) = whole.turn("two", Some(t1_reply), vec![digest()]).await;
    assert!(seen.starts_with("user: one\nassistant: alpha"), "{seen}");
}

/// The branch a restart reads from the store is the one the cache held before it: two turns
/// with the same message answering the same first turn, one before a crash (its branch from
/// the cache the first turn's end filled), one after (read cold), carry the same request.
#[tokio::test]
async fn e8_a_branch_read_after_a_restart_is_the_one_cached_before_it() {
    e8_a_branch_read_after_a_restart_is_the_one_cached_before_it_on(Restarts::new()).await
}

pub(crate) async fn e8_a_branch_read_after_a_restart_is_the_one_cached_before_it_on(
    restarts: Restarts,
) {
    let window = openprogram::RestartWindow::Unlimited;
    let turn = |parent: Option<MessageId>, message: &str, script: Vec<Value>| StartRequest {
        message: message.into(),
        parent_message_id: parent,
        script: elements(script),
        ..Default::default()
    };
    let finish = |runtime: &Runtime, started: openprogram::StartReply| {
        let runtime = runtime.clone();
        let session = restarts.session;
        async move {
            wait_state(&runtime, session, started.execution_id, "completed").await;
            started
        }
    };
    let runtime = restarts.open(window);
    let first = runtime
        .start_execution(
            restarts.session,
            turn(None, "find it", vec![echo("a.log"), reply("a.log it is")]),
        )
        .await
        .expect("start");
    let first = finish(&runtime, first).await;
    let cached = runtime
        .start_execution(
            restarts.session,
            turn(Some(first.reply_message_id), "continue", vec![digest()]),
        )
        .await
        .expect("start");
    let cached = finish(&runtime, cached).await;
    let before = restarts.snapshot(&runtime, cached.execution_id).await.text;
    crash(runtime);
    let runtime = restarts.open(window);
    let cold = runtime
        .start_execution(
            restarts.session,
            turn(Some(first.reply_message_id), "continue", vec![digest()]),
        )
        .await
        .expect("start");
    let cold = finish(&runtime, cold).await;
    let after = restarts.snapshot(&runtime, cold.execution_id).await.text;
    assert_eq!(after, before);
    assert!(
        before.starts_with("user: find it\nassistant: call call00001 echo"),
        "{before}"
    );
    runtime.shutdown().await;
}

/// A turn keeps the summary it fixed: a compaction made while it waits drops that summary
/// from the conversation record (a newer one covers its path), and after a restart the turn's
/// next request still carries the summary it started with, read from its pin.
#[tokio::test]
async fn e8_a_turn_keeps_the_summary_it_fixed_when_a_later_compaction_drops_it() {
    let restarts = Restarts::new();
    let open = || {
        restarts.open_with(|builder| {
            builder
                .compactor(Arc::new(Counting))
                .restart_window(openprogram::RestartWindow::Unlimited)
        })
    };
    let runtime = open();
    let session = restarts.session;
    let turn = |parent: Option<MessageId>, message: &str, script: Vec<Value>| StartRequest {
        message: message.into(),
        parent_message_id: parent,
        script: elements(script),
        ..Default::default()
    };
    let run = |runtime: &Runtime, request: StartRequest, state: &'static str| {
        let runtime = runtime.clone();
        async move {
            let started = runtime
                .start_execution(session, request)
                .await
                .expect("start");
            wait_state(&runtime, session, started.execution_id, state).await;
            started
        }
    };
    let t1 = run(
        &runtime,
        turn(None, "one", vec![reply("first")]),
        "completed",
    )
    .await;
    let t2 = run(
        &runtime,
        turn(Some(t1.reply_message_id), "two", vec![reply("second")]),
        "completed",
    )
    .await;
    runtime
        .compact(session, t1.reply_message_id)
        .await
        .expect("compact t1");
    let t3 = run(
        &runtime,
        turn(
            Some(t2.reply_message_id),
            "three",
            vec![json!({"ask": "go?"}), digest()],
        ),
        "waiting",
    )
    .await;
    // Through t2: the summary through t1 is needed on no path any more.
    let newer = runtime
        .compact(session, t2.reply_message_id)
        .await
        .expect("compact t2");
    let view = runtime.session(session).expect("session");
    assert_eq!(
        view.compactions,
        vec![newer],
        "the older summary was dropped"
    );
    crash(runtime);
    let runtime = open();
    let waiting = restarts.snapshot(&runtime, t3.execution_id).await;
    let wait_id = waiting.waits.last().expect("a wait").wait_id;
    let answer = command_of(json!({"kind": "answer", "wait_id": wait_id, "answer": "yes"}));
    let answered = runtime
        .command(session, t3.execution_id, answer)
        .await
        .expect("answer");
    assert_eq!(answered.status, "applied", "{answered:?}");
    let done = wait_state(&runtime, session, t3.execution_id, "completed").await;
    assert!(
        done.text.starts_with(
            "user: [A summary of the conversation so far]\n2 messages before\nuser: two\nassistant: second\nuser: three"
        ),
        "{}",
        done.text
    );
    runtime.shutdown().await;
}
