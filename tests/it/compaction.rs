//! C-3 compaction and C-2's naming, through the library on a real store: a compaction
//! replaces a prefix of one branch with the compactor's summary, shows on every list that
//! holds the turn it goes through and on no other, keeps branches and Activity exactly as
//! they were, keeps the originals readable, survives a restart, and is made once per turn;
//! a policy compacts after a completed turn; the naming hook runs only after the turn freed
//! its session, and a name is given once.

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::FutureExt;
use openprogram::storage::{MessageId, SessionId};
use openprogram::{
    CompactionPolicy, Compactor, Message, MessagesQuery, Runtime, SessionNamer, StartRequest,
};
use serde_json::json;

use crate::support::*;

/// Summarizes as "N: first text … last text", and keeps what it was given.
#[derive(Default)]
struct Recording {
    inputs: Mutex<Vec<Vec<(String, String)>>>,
}

impl Compactor for Recording {
    fn summarize(
        &self,
        _session_id: SessionId,
        prefix: Vec<Message>,
    ) -> BoxFuture<'static, Result<String, String>> {
        let seen: Vec<(String, String)> = prefix
            .iter()
            .map(|message| (message.role.to_owned(), message.text.clone()))
            .collect();
        let summary = format!(
            "{}: {} … {}",
            seen.len(),
            seen.first().map_or("", |(_, text)| text),
            seen.last().map_or("", |(_, text)| text)
        );
        self.inputs.lock().expect("inputs").push(seen);
        futures::future::ready(Ok(summary)).boxed()
    }
}

fn runtime(
    dir: &std::path::Path,
    compactor: Arc<Recording>,
    policy: Option<CompactionPolicy>,
) -> Runtime {
    let mut builder = Runtime::builder().data_dir(dir).compactor(compactor);
    if let Some(policy) = policy {
        builder = builder.compaction_policy(policy);
    }
    builder.open().expect("open")
}

/// A turn `text` answering `parent`, run to its end; its (user, reply) message ids.
async fn turn(
    runtime: &Runtime,
    session: SessionId,
    text: &str,
    parent: Option<MessageId>,
) -> (openprogram::storage::ExecutionId, MessageId, MessageId) {
    let request = StartRequest {
        message: text.into(),
        parent_message_id: parent,
        script: elements(vec![reply(&format!("re {text}"))]),
        ..Default::default()
    };
    let started = runtime
        .start_execution(session, request)
        .await
        .expect("start");
    wait_state(runtime, session, started.execution_id, "completed").await;
    (
        started.execution_id,
        started.user_message_id,
        started.reply_message_id,
    )
}

fn texts(runtime: &Runtime, session: SessionId, query: MessagesQuery) -> Vec<String> {
    runtime
        .messages(session, &query)
        .expect("messages")
        .messages
        .iter()
        .map(|message| format!("{}:{}", message.role, message.text))
        .collect()
}

#[tokio::test]
async fn c3_b1_a_compaction_replaces_a_prefix_of_its_branch_and_keeps_the_graph() {
    let dir = tempfile::tempdir().expect("dir");
    let compactor = Arc::new(Recording::default());
    let runtime = runtime(dir.path(), compactor.clone(), None);
    let session = SessionId::new();
    // Two branches sharing t1: t1 → t2 → t3, and t1 → b.
    let (t1, _, t1_reply) = turn(&runtime, session, "t1", None).await;
    let (t2, t2_user, t2_reply) = turn(&runtime, session, "t2", Some(t1_reply)).await;
    let (t3, _, t3_reply) = turn(&runtime, session, "t3", Some(t2_reply)).await;
    let (b, _, b_reply) = turn(&runtime, session, "b", Some(t1_reply)).await;
    let activity = |runtime: &Runtime| {
        serde_json::to_value(runtime.activity(session).expect("activity")).expect("json")
    };
    let before = activity(&runtime);
    let branch_of = |execution| {
        let activity = runtime.activity(session).expect("activity");
        activity
            .history
            .iter()
            .find(|row| row.details.iter().any(|e| e.execution_id == execution))
            .map(|row| row.branch_id)
            .expect("a branch")
    };
    let (main, side) = (branch_of(t3), branch_of(b));
    assert_ne!(main, side);

    // Through t2, named by its user message (its reply names it too).
    let compaction = runtime.compact(session, t2_user).await.expect("compact");
    assert_eq!((compaction.through, compaction.replaces.len()), (t2, 2));
    assert_eq!(compaction.summary, "4: t1 … re t2");
    assert_eq!(
        compactor.inputs.lock().expect("inputs")[0],
        [
            ("user".to_owned(), "t1".to_owned()),
            ("assistant".into(), "re t1".into()),
            ("user".into(), "t2".into()),
            ("assistant".into(), "re t2".into())
        ]
    );
    let on = |branch| MessagesQuery {
        branch: Some(branch),
        ..Default::default()
    };
    assert_eq!(
        texts(&runtime, session, on(main)),
        ["summary:4: t1 … re t2", "user:t3", "assistant:re t3"]
    );
    // The other branch does not go through t2: its messages are the originals.
    assert_eq!(
        texts(&runtime, session, on(side)),
        ["user:t1", "assistant:re t1", "user:b", "assistant:re b"]
    );
    // The whole session: the summary where t1 was; b still names t1's reply, which the
    // summary says it stands in for.
    let whole = runtime
        .messages(session, &MessagesQuery::default())
        .expect("messages");
    let summary = &whole.messages[0];
    assert_eq!(summary.role, "summary");
    assert!(summary.replaces.contains(&t1_reply));
    assert_eq!(whole.messages.len(), 1 + 2 + 2);
    assert_eq!(whole.messages[3].parent_id, Some(t1_reply));
    assert_eq!(whole.conversation_version, 1);
    // The originals stay readable; branches and Activity are exactly as they were.
    let originals = MessagesQuery {
        branch: Some(main),
        originals: true,
        ..Default::default()
    };
    assert_eq!(texts(&runtime, session, originals.clone()).len(), 6);
    assert_eq!(activity(&runtime), before);

    // Asked again: the same compaction, and the hook is not asked again.
    let again = runtime.compact(session, t2_reply).await.expect("again");
    assert_eq!(again, compaction);
    assert_eq!(compactor.inputs.lock().expect("inputs").len(), 1);

    // A later compaction of the other branch, then the main one further: each list shows the
    // summary that covers the most of it, and the later summary was written from the earlier.
    runtime.compact(session, b_reply).await.expect("compact b");
    assert_eq!(texts(&runtime, session, on(side)), ["summary:4: t1 … re b"]);
    runtime
        .compact(session, t3_reply)
        .await
        .expect("compact t3");
    assert_eq!(
        texts(&runtime, session, on(main)),
        ["summary:3: 4: t1 … re t2 … re t3"]
    );
    assert_eq!(activity(&runtime), before);
    // Paged one entry at a time, a cursor from before the compaction still reads on.
    let first = runtime
        .messages(
            session,
            &MessagesQuery {
                after: Some(t1),
                limit: Some(1),
                ..Default::default()
            },
        )
        .expect("page");
    // The whole session now: the summary through b (in t1's place), then the one through t3
    // (the one through t2 was dropped: every branch holding t2 holds t3). A cursor from
    // before, on t1, goes on after the entry holding t1.
    assert_eq!(
        texts(&runtime, session, MessagesQuery::default()),
        ["summary:4: t1 … re b", "summary:3: 4: t1 … re t2 … re t3"]
    );
    let texts_of = |page: &openprogram::MessagesPage| -> Vec<String> {
        page.messages
            .iter()
            .map(|message| format!("{}:{}", message.role, message.text))
            .collect()
    };
    assert_eq!(texts_of(&first), ["summary:3: 4: t1 … re t2 … re t3"]);
    assert_eq!(first.next, None);
    runtime.halt();
    drop(runtime);

    // After a restart: the same.
    let runtime = self::runtime(dir.path(), Arc::new(Recording::default()), None);
    assert_eq!(
        texts(&runtime, session, on(main)),
        ["summary:3: 4: t1 … re t2 … re t3"]
    );
    assert_eq!(texts(&runtime, session, originals).len(), 6);
    let view = runtime.session(session).expect("session");
    assert_eq!((view.compactions.len(), view.executions), (2, 4));
    runtime.halt();
}

#[tokio::test]
async fn c3_compaction_refuses_what_it_cannot_do_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let runtime = runtime(dir.path(), Arc::new(Recording::default()), None);
    let session = SessionId::new();
    let (_, _, done) = turn(&runtime, session, "t1", None).await;
    // A turn still running.
    let running = runtime
        .start_execution(
            session,
            StartRequest {
                message: "slow".into(),
                parent_message_id: Some(done),
                script: elements(vec![sleep(60_000), reply("late")]),
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let refused = runtime.compact(session, running.reply_message_id).await;
    assert!(
        matches!(refused, Err(openprogram::Error::InvalidRequest(_))),
        "{refused:?}"
    );
    let unknown = runtime.compact(session, MessageId::new()).await;
    assert!(
        matches!(unknown, Err(openprogram::Error::NotFound)),
        "{unknown:?}"
    );
    assert!(runtime
        .session(session)
        .expect("session")
        .compactions
        .is_empty());
    // Without a compactor.
    let plain = Runtime::builder()
        .data_dir(tempfile::tempdir().expect("dir").path())
        .open()
        .expect("open");
    let missing = plain.compact(session, done).await;
    assert!(
        matches!(missing, Err(openprogram::Error::HookMissing(_))),
        "{missing:?}"
    );
    runtime.halt();
    plain.halt();
}

#[tokio::test]
async fn c3_a_policy_compacts_a_long_branch_after_a_completed_turn() {
    let dir = tempfile::tempdir().expect("dir");
    let policy = CompactionPolicy { past: 3, keep: 1 };
    let runtime = runtime(dir.path(), Arc::new(Recording::default()), Some(policy));
    let session = SessionId::new();
    let mut parent = None;
    for text in ["t1", "t2", "t3"] {
        parent = Some(turn(&runtime, session, text, parent).await.2);
    }
    // Three entries: not past the policy.
    assert!(runtime
        .session(session)
        .expect("session")
        .compactions
        .is_empty());
    turn(&runtime, session, "t4", parent).await;
    // Four: everything but the newest turn is summarized, once the turn completed.
    let deadline = std::time::Instant::now() + DEADLINE;
    while runtime
        .session(session)
        .expect("session")
        .compactions
        .is_empty()
    {
        assert!(std::time::Instant::now() < deadline, "never compacted");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        texts(&runtime, session, MessagesQuery::default()),
        ["summary:6: t1 … re t3", "user:t4", "assistant:re t4"]
    );
    runtime.halt();
}

#[tokio::test]
async fn c2_naming_runs_after_the_turn_freed_its_session_and_names_it_once() {
    let dir = tempfile::tempdir().expect("dir");
    let (runtime, namer) = named(dir.path());
    let session = SessionId::new();
    let (_, _, first) = turn(&runtime, session, "the weather", None).await;
    // The hook holds the name; the next message runs and completes meanwhile: the session
    // was free before the naming began.
    namer.called.acquire().await.expect("called").forget();
    let (_, _, second) = turn(&runtime, session, "and tomorrow", Some(first)).await;
    assert_eq!(runtime.session(session).expect("session").name, None);
    namer.release.add_permits(1);
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let name = runtime.session(session).expect("session").name;
        if name.is_some() {
            assert_eq!(name.as_deref(), Some("about the weather"));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never named");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The second turn's naming found no name when it began, and waits too: let it go; the
    // first name stays. A third turn asks no more.
    namer.called.acquire().await.expect("called").forget();
    namer.release.add_permits(1);
    let (third, _, _) = turn(&runtime, session, "thanks", Some(second)).await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(
        runtime.session(session).expect("session").name.as_deref(),
        Some("about the weather")
    );
    assert_eq!(namer.calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    // Deleted, the session's name goes, and a late follow-up never brings it back.
    assert_eq!(
        runtime.snapshot(session, third).await.expect("third").state,
        "completed"
    );
    runtime.purge_session(session).await.expect("purge");
    assert_eq!(runtime.session(session).expect("session").name, None);
    runtime.halt();
}

/// A session deleted while its naming hook runs stays without a name.
#[tokio::test]
async fn c2_a_name_given_after_the_session_was_deleted_is_not_kept() {
    let dir = tempfile::tempdir().expect("dir");
    let (runtime, namer) = named(dir.path());
    let session = SessionId::new();
    turn(&runtime, session, "secret plans", None).await;
    namer.called.acquire().await.expect("called").forget();
    runtime.purge_session(session).await.expect("purge");
    namer.release.add_permits(1);
    // The hook's answer arrives after the deletion: give its write every chance to land.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(runtime.session(session).expect("session").name, None);
    runtime.halt();
}

/// A runtime on `dir` whose naming hook is a held `Namer`.
fn named(dir: &std::path::Path) -> (Runtime, Arc<Namer>) {
    let namer = Arc::new(Namer::default());
    let runtime = Runtime::builder()
        .data_dir(dir)
        .session_namer(Arc::new(NamerHook(namer.clone())))
        .open()
        .expect("open");
    (runtime, namer)
}

/// Names after the first words, each call held until the test gives a permit; tells the
/// test each call (`called`).
struct Namer {
    release: tokio::sync::Semaphore,
    called: Arc<tokio::sync::Semaphore>,
    calls: std::sync::atomic::AtomicUsize,
}

impl Default for Namer {
    fn default() -> Self {
        Self {
            release: tokio::sync::Semaphore::new(0),
            called: Arc::new(tokio::sync::Semaphore::new(0)),
            calls: Default::default(),
        }
    }
}

/// The runtime's handle on the test's `Namer`.
struct NamerHook(Arc<Namer>);

impl SessionNamer for NamerHook {
    fn name(
        &self,
        _session_id: SessionId,
        turn: Vec<Message>,
    ) -> BoxFuture<'static, Result<Option<String>, String>> {
        let namer = Arc::clone(&self.0);
        namer
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        namer.called.add_permits(1);
        let name = format!("about {}", turn[0].text);
        async move {
            let permit = namer.release.acquire().await.map_err(|e| e.to_string())?;
            permit.forget();
            Ok(Some(name))
        }
        .boxed()
    }
}

#[test]
fn c3_over_http_compact_read_and_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = crate::http::TestServer::on(
        dir,
        |builder| {
            builder
                .compactor(Arc::new(openprogram::Excerpts))
                .session_namer(Arc::new(openprogram::FirstWords))
        },
        |_| {},
    );
    let session = server.session();
    let mut parent = serde_json::Value::Null;
    let mut replies = Vec::new();
    for text in ["plan the trip to Lisbon", "book the train"] {
        let started = server.start(
            &session,
            json!({"kind": "agent", "message": text, "parent_message_id": parent,
                   "script": [{"reply": format!("done: {text}")}]}),
        );
        let id = started["execution_id"].as_str().expect("id").to_owned();
        server.wait_state(&session, &id, "completed");
        parent = started["reply_message_id"].clone();
        replies.push(parent.as_str().expect("reply").to_owned());
    }
    let path = format!("/v1/sessions/{}/compact", session.0);
    let (status, compaction) = server.call(
        "POST",
        &path,
        Some(&session.1),
        Some(&json!({"through": replies[0]})),
    );
    assert_eq!(status, 201, "{compaction}");
    assert_eq!(
        compaction["summary"],
        "user: plan the trip to Lisbon\nassistant: done: plan the trip to Lisbon\n"
    );
    let messages = format!("/v1/sessions/{}/messages", session.0);
    let (status, page) = server.call("GET", &messages, Some(&session.1), None);
    assert_eq!(status, 200, "{page}");
    let roles: Vec<&str> = page["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|message| message["role"].as_str().expect("role"))
        .collect();
    assert_eq!(roles, ["summary", "user", "assistant"]);
    assert_eq!(
        page["messages"][0]["replaces"]
            .as_array()
            .expect("ids")
            .len(),
        2
    );
    let (_, originals) = server.call(
        "GET",
        &format!("{messages}?originals=true"),
        Some(&session.1),
        None,
    );
    assert_eq!(originals["messages"].as_array().expect("messages").len(), 4);
    // The session: named after its first words, with its compaction.
    let view = format!("/v1/sessions/{}", session.0);
    let deadline = std::time::Instant::now() + DEADLINE;
    let shown = loop {
        let (status, shown) = server.call("GET", &view, Some(&session.1), None);
        assert_eq!(status, 200, "{shown}");
        if !shown["name"].is_null() {
            break shown;
        }
        assert!(std::time::Instant::now() < deadline, "never named: {shown}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(shown["name"], "plan the trip to Lisbon");
    assert_eq!(shown["compactions"].as_array().expect("list").len(), 1);
    assert_eq!(shown["executions"], 2);
    // Refusals: an unknown message, a body that is no id, an unknown field.
    for (body, code) in [
        (json!({"through": MessageId::new()}), 404),
        (json!({"through": "nope"}), 400),
        (json!({"through": replies[1], "also": 1}), 400),
    ] {
        let (status, error) = server.call("POST", &path, Some(&session.1), Some(&body));
        assert_eq!(status, code, "{body}: {error}");
    }
    // Deleting the session takes its name and summaries.
    let (status, _) = server.call("DELETE", &view, Some(crate::http::ADMIN), None);
    assert_eq!(status, 200);
    let (status, gone) = server.call("GET", &view, Some(&session.1), None);
    assert_eq!(status, 200, "{gone}");
    assert_eq!(
        (&gone["name"], &gone["compactions"], &gone["executions"]),
        (&json!(null), &json!([]), &json!(0))
    );
}

/// C-3 with retention (S-8): once the turns a summary replaced are purged, the summary still
/// opens the conversation, before the turn that answered them; their originals are gone.
#[tokio::test]
async fn c3_a_summary_outlives_the_turns_retention_purges() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = Arc::new(openprogram::ManualClock::new());
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .clock(clock.clone())
        .retain_finished(std::time::Duration::from_secs(60))
        .compactor(Arc::new(Recording::default()))
        .open()
        .expect("open");
    let session = SessionId::new();
    let (t1, _, t1_reply) = turn(&runtime, session, "t1", None).await;
    let (t2, _, t2_reply) = turn(&runtime, session, "t2", Some(t1_reply)).await;
    runtime.compact(session, t2_reply).await.expect("compact");
    // A turn that lives on: it waits for an answer.
    let live = runtime
        .start_execution(
            session,
            StartRequest {
                message: "t3".into(),
                parent_message_id: Some(t2_reply),
                script: elements(vec![json!({"ask": "go on?"}), reply("re t3")]),
                ..Default::default()
            },
        )
        .await
        .expect("start");
    wait_state(&runtime, session, live.execution_id, "waiting").await;
    clock.advance(std::time::Duration::from_secs(120));
    let deadline = std::time::Instant::now() + DEADLINE;
    while ![t1, t2].iter().all(|id| {
        runtime
            .store()
            .purged(*id)
            .ok()
            .flatten()
            .is_some_and(|gone| gone.finished)
    }) {
        assert!(std::time::Instant::now() < deadline, "never purged");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        texts(&runtime, session, MessagesQuery::default()),
        ["summary:4: t1 … re t2", "user:t3", "assistant:"]
    );
    let originals = MessagesQuery {
        originals: true,
        ..Default::default()
    };
    assert_eq!(
        texts(&runtime, session, originals),
        ["user:t3", "assistant:"]
    );
    // The branch, named as Activity names it now.
    let activity = runtime.activity(session).expect("activity");
    let branch = activity.needs_attention[0].branch_id;
    let on_branch = MessagesQuery {
        branch: Some(branch),
        ..Default::default()
    };
    assert_eq!(texts(&runtime, session, on_branch).len(), 3);
    runtime.halt();
}
