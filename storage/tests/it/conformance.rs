//! One suite, two backends (issue 34): the event log's contract — CAS, fencing, K-4's
//! stored outcomes, records and blobs committed with their transition, cursors, the
//! session and state indexes, purge, durability across a reopen, incarnations — written
//! once against `EventStore` and run on the sled store (`sled::…`, always) and on the
//! PostgreSQL store (`postgres::…`, reported ignored by `cargo test` on a machine without
//! PostgreSQL, see `pg_cluster`). The sled-only tests beside it cover what only sled has
//! (its log records, materialization, file damage).

use std::sync::Arc;

use openprogram_storage::{
    Blob, CommandId, CommandRecord, CommandStatus, EffectId, EventStore, ExecutionId,
    ExecutionState, Outcome, ProjectionRecord, PurgeStep, ReceiptRecord, ReceiptStatus, SessionId,
    Transition, Upsert,
};

use crate::support::*;

use crate::conformance_backends::Backend;
use crate::suite;

suite!(
    s2_a_stale_version_conflicts_and_writes_nothing,
    s2_a_fenced_writer_is_refused_and_a_newer_epoch_claims,
    s2_many_writers_commit_in_groups_with_gapless_seqs_and_rising_positions,
    s2_records_and_blobs_commit_with_their_transition,
    k4_a_command_id_keeps_its_stored_outcome_across_a_reopen,
    k4_a_rejection_records_the_command_and_changes_nothing_else,
    k4_one_command_creating_two_executions_at_once_commits_once,
    s1_cursors_page_one_execution_and_the_whole_log,
    s1_a_cursor_inside_a_transition_reads_the_rest_of_it,
    b1_sessions_and_states_list_their_executions,
    s8_a_purge_removes_an_ended_execution_and_refuses_the_rest,
    s1_a_reopen_keeps_everything_and_starts_a_new_incarnation,
    n2_node_leases_register_renew_lapse_and_are_superseded_by_a_later_incarnation,
    r07_close_answers_what_was_queued_refuses_the_rest_and_lets_the_store_open_again,
);

fn accepted(command_id: CommandId, execution_id: ExecutionId, payload: u8) -> CommandRecord {
    CommandRecord {
        command_id,
        execution_id,
        kind: "pause".into(),
        payload_hash: [payload; 32],
        status: CommandStatus::Accepted,
        reason: None,
        reason_code: None,
        result_version: None,
        child_execution_id: None,
        accepted_at_ms: 1,
    }
}

fn accept(record: CommandRecord) -> Transition {
    Transition::new(record.execution_id, vec![decided("accept")]).with(Upsert::Command(record))
}

async fn s2_a_stale_version_conflicts_and_writes_nothing(backend: &dyn Backend) {
    let store = backend.open();
    let a = create(&*store).await;
    append(&*store, a, 1, "first").await;
    let stale = Transition::new(a, vec![decided("stale")]).expect_version(1);
    assert_eq!(
        store.submit(stale).await.expect("submit"),
        Outcome::VersionConflict { current: 2 }
    );
    assert_eq!(all_events(&*store, a).len(), 2);
    assert_eq!(store.head(a).expect("head").map(|h| h.version), Some(2));
    let again = Transition::create(head(a), vec![decided("again")]);
    assert_eq!(
        store.submit(again).await.expect("submit"),
        Outcome::VersionConflict { current: 2 }
    );
    let unknown = Transition::new(ExecutionId::new(), vec![decided("nobody")]);
    assert!(store.submit(unknown).await.is_err());
}

async fn s2_a_fenced_writer_is_refused_and_a_newer_epoch_claims(backend: &dyn Backend) {
    let store = backend.open();
    let a = create(&*store).await;
    let claim = Transition::new(a, vec![decided("attempt 2")])
        .expect_version(1)
        .by_epoch(2);
    committed(store.submit(claim).await.expect("claim"));
    let stale = Transition::new(a, vec![decided("attempt 1")])
        .expect_version(2)
        .by_epoch(1);
    assert_eq!(
        store.submit(stale).await.expect("submit"),
        Outcome::Fenced { current_epoch: 2 }
    );
    // Fencing first: a stale writer with a stale version is fenced, not a conflict.
    let stale = Transition::new(a, vec![decided("attempt 1")])
        .expect_version(1)
        .by_epoch(1);
    assert_eq!(
        store.submit(stale).await.expect("submit"),
        Outcome::Fenced { current_epoch: 2 }
    );
    let current = Transition::new(a, vec![decided("attempt 2 again")])
        .expect_version(2)
        .by_epoch(2);
    committed(store.submit(current).await.expect("current"));
    let head = store.head(a).expect("head").expect("exists");
    assert_eq!((head.version, head.fencing_epoch), (3, 2));
    let epochs: Vec<u64> = all_events(&*store, a)
        .iter()
        .map(|e| e.writer_epoch)
        .collect();
    assert_eq!(epochs, vec![0, 2, 2]);
}

/// Seqs are gapless per execution; positions rise along the whole log (gapless in sled,
/// `s1_log`; counted from transaction ids in PostgreSQL, `pg_positions`).
async fn s2_many_writers_commit_in_groups_with_gapless_seqs_and_rising_positions(
    backend: &dyn Backend,
) {
    let store: Arc<dyn EventStore> = Arc::from(backend.open());
    let writers: Vec<_> = (0..100)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let id = create(&*store).await;
                for version in 1..=5 {
                    append(&*store, id, version, "step").await;
                }
                id
            })
        })
        .collect();
    let mut ids = Vec::new();
    for writer in writers {
        ids.push(writer.await.expect("writer"));
    }
    for id in &ids {
        let seqs: Vec<u64> = all_events(&*store, *id).iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=6).collect::<Vec<_>>());
    }
    for id in &ids {
        let positions: Vec<u64> = all_events(&*store, *id)
            .iter()
            .map(|e| e.position)
            .collect();
        assert!(
            positions.windows(2).all(|pair| pair[0] < pair[1]),
            "{id}: {positions:?}"
        );
    }
    let positions: Vec<u64> = settled_log(&*store, 600)
        .iter()
        .map(|e| e.position)
        .collect();
    assert_eq!(positions.len(), 600);
    assert!(positions.windows(2).all(|pair| pair[0] < pair[1]));
    let metrics = store.metrics();
    assert_eq!(metrics.transitions, 600);
    assert!(
        metrics.groups < 600,
        "100 writers at once share group commits ({} groups)",
        metrics.groups
    );
}

async fn s2_records_and_blobs_commit_with_their_transition(backend: &dyn Backend) {
    let store = backend.open();
    let a = create(&*store).await;
    let receipt = ReceiptRecord {
        effect_id: EffectId::new(),
        execution_id: a,
        attempt_id: None,
        epoch: 0,
        tool: "append".into(),
        status: ReceiptStatus::Confirmed,
        output: Some("{\"ok\":true}".into()),
    };
    let blob = Blob::new(b"a tool's large output".to_vec());
    let projection = ProjectionRecord {
        execution_id: a,
        through_seq: 2,
        format: 1,
        state: vec![1, 2, 3],
    };
    let transition = Transition::new(a, vec![decided("tool done")])
        .expect_version(1)
        .with(Upsert::Receipt(receipt.clone()))
        .with(Upsert::Blob(blob.clone()))
        .with(Upsert::Projection(projection.clone()));
    committed(store.submit(transition).await.expect("submit"));
    assert_eq!(
        store.receipt(receipt.effect_id).expect("receipt"),
        Some(receipt.clone())
    );
    assert_eq!(
        store.blob(blob.hash()).expect("blob"),
        Some(blob.bytes().to_vec())
    );
    assert_eq!(store.projection(a).expect("projection"), Some(projection));
    // A record upserted again replaces the one before.
    let failed = ReceiptRecord {
        status: ReceiptStatus::Failed,
        ..receipt.clone()
    };
    let transition = Transition::new(a, vec![decided("tool failed")])
        .expect_version(2)
        .with(Upsert::Receipt(failed.clone()));
    committed(store.submit(transition).await.expect("submit"));
    assert_eq!(
        store.receipt(receipt.effect_id).expect("receipt"),
        Some(failed)
    );
    // A transition refused writes none of its records.
    let refused_receipt = ReceiptRecord {
        effect_id: EffectId::new(),
        ..receipt
    };
    let refused = Transition::new(a, vec![decided("stale")])
        .expect_version(1)
        .with(Upsert::Receipt(refused_receipt.clone()));
    assert_eq!(
        store.submit(refused).await.expect("submit"),
        Outcome::VersionConflict { current: 3 }
    );
    assert_eq!(
        store.receipt(refused_receipt.effect_id).expect("receipt"),
        None
    );
    assert_eq!(
        store
            .blob(Blob::new(b"never".to_vec()).hash())
            .expect("blob"),
        None
    );
}

/// K-4 for a command whose transition creates an execution (a fork: each delivery names a
/// child of its own), sent twice at once: one creates, the other finds the record — also
/// when the two go to different committers (PostgreSQL runs two) or nodes.
async fn k4_one_command_creating_two_executions_at_once_commits_once(backend: &dyn Backend) {
    let store = backend.open();
    for round in 0..20 {
        let command_id = CommandId::new();
        let deliver = |child: ExecutionId| {
            Transition::create(head(child), vec![decided("forked")])
                .with(Upsert::Command(accepted(command_id, child, 1)))
        };
        let (a, b) = (ExecutionId::new(), ExecutionId::new());
        let (first, second) = futures::join!(store.submit(deliver(a)), store.submit(deliver(b)));
        let outcomes = [first.expect("a"), second.expect("b")];
        let created = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, Outcome::Committed(_)))
            .count();
        assert_eq!(created, 1, "round {round}: {outcomes:?}");
        let heads = [store.head(a).expect("a"), store.head(b).expect("b")];
        assert_eq!(heads.iter().flatten().count(), 1, "round {round}");
    }
}

async fn k4_a_command_id_keeps_its_stored_outcome_across_a_reopen(backend: &dyn Backend) {
    let command_id = CommandId::new();
    let a;
    {
        let store = backend.open();
        a = create(&*store).await;
        committed(
            store
                .submit(accept(accepted(command_id, a, 1)))
                .await
                .expect("accept"),
        );
        assert_eq!(
            store
                .submit(accept(accepted(command_id, a, 1)))
                .await
                .expect("retry"),
            Outcome::DuplicateCommand {
                stored: accepted(command_id, a, 1)
            }
        );
        assert_eq!(
            store
                .submit(accept(accepted(command_id, a, 2)))
                .await
                .expect("other"),
            Outcome::CommandConflict {
                stored: accepted(command_id, a, 1)
            }
        );
        let applied = CommandRecord {
            status: CommandStatus::Applied,
            result_version: Some(3),
            ..accepted(command_id, a, 1)
        };
        committed(store.submit(accept(applied)).await.expect("apply"));
    }
    let store = backend.open();
    let applied = CommandRecord {
        status: CommandStatus::Applied,
        result_version: Some(3),
        ..accepted(command_id, a, 1)
    };
    assert_eq!(
        store.command(command_id).expect("command"),
        Some(applied.clone())
    );
    // Decided: neither a new submission nor another outcome changes it.
    for again in [
        accepted(command_id, a, 1),
        CommandRecord {
            status: CommandStatus::Rejected,
            ..accepted(command_id, a, 1)
        },
    ] {
        assert_eq!(
            store.submit(accept(again)).await.expect("again"),
            Outcome::DuplicateCommand {
                stored: applied.clone()
            }
        );
    }
    assert_eq!(store.head(a).expect("head").map(|h| h.version), Some(3));
}

async fn k4_a_rejection_records_the_command_and_changes_nothing_else(backend: &dyn Backend) {
    let store = backend.open();
    let a = create(&*store).await;
    let rejected = CommandRecord {
        status: CommandStatus::Rejected,
        reason: Some("not allowed".into()),
        ..accepted(CommandId::new(), a, 1)
    };
    assert_eq!(
        store
            .submit(Transition::rejection(rejected.clone(), 0, None))
            .await
            .expect("stale rejection"),
        Outcome::VersionConflict { current: 1 }
    );
    assert_eq!(store.command(rejected.command_id).expect("command"), None);
    assert_eq!(
        store
            .submit(Transition::rejection(rejected.clone(), 1, None))
            .await
            .expect("rejection"),
        Outcome::Recorded { version: 1 }
    );
    assert_eq!(
        store.command(rejected.command_id).expect("command"),
        Some(rejected.clone())
    );
    assert_eq!(store.head(a).expect("head").map(|h| h.version), Some(1));
    assert_eq!(all_events(&*store, a).len(), 1);
    assert_eq!(
        store.submit(accept(rejected.clone())).await.expect("retry"),
        Outcome::DuplicateCommand { stored: rejected }
    );
}

async fn s1_cursors_page_one_execution_and_the_whole_log(backend: &dyn Backend) {
    let store = backend.open();
    let a = create(&*store).await;
    let b = create(&*store).await;
    for version in 1..=9 {
        append(&*store, a, version, "a").await;
        append(&*store, b, version, "b").await;
    }
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let page = store.events_after(a, after, 4).expect("page");
        assert!(page.len() <= 4);
        let Some(last) = page.last() else { break };
        after = last.seq;
        seen.extend(page.iter().map(|event| event.seq));
    }
    assert_eq!(seen, (1..=10).collect::<Vec<_>>());
    let log = settled_log(&*store, 20);
    assert_eq!(log.len(), 20);
    assert!(log
        .windows(2)
        .all(|pair| pair[0].position < pair[1].position));
    let tail = store.log_after(log[14].position, 100).expect("tail");
    assert_eq!(tail, log[15..].to_vec());
    assert_eq!(
        store.log_after(log[19].position, 100).expect("end"),
        Vec::new()
    );
}

/// A transition's events share one row in PostgreSQL (and one log record in sled): a cursor
/// that stops inside it reads the rest of it, and the positions a commit answers are the
/// ones read back.
async fn s1_a_cursor_inside_a_transition_reads_the_rest_of_it(backend: &dyn Backend) {
    let store = backend.open();
    let (a, b) = (create(&*store).await, create(&*store).await);
    let mut answered = Vec::new();
    for version in 1..=4 {
        for (id, n) in [(a, 5), (b, 3)] {
            let events = (0..n).map(|i| decided(&format!("{version}.{i}"))).collect();
            let transition = Transition::new(id, events).expect_version(version);
            let outcome = committed(store.submit(transition).await.expect("submit"));
            let positions: Vec<u64> = outcome.events.iter().map(|e| e.position).collect();
            assert_eq!(outcome.positions.clone().collect::<Vec<_>>(), positions);
            assert_eq!(positions.len(), n);
            answered.extend(outcome.events);
        }
    }
    let log = settled_log(&*store, 2 + 4 * 8);
    assert_eq!(log.len(), 2 + 4 * 8);
    assert_eq!(
        &log[2..],
        &answered[..],
        "read back as the commits answered"
    );
    assert!(log
        .windows(2)
        .all(|pair| pair[0].position < pair[1].position));
    for limit in [1, 2, 3, 7] {
        let (mut paged, mut after) = (Vec::new(), 0);
        loop {
            let page = store.log_after(after, limit).expect("page");
            assert!(page.len() <= limit);
            let Some(last) = page.last() else { break };
            after = last.position;
            paged.extend(page);
            assert!(
                paged.len() <= log.len(),
                "a page repeats events (limit {limit})"
            );
        }
        assert_eq!(paged, log, "the whole log in pages of {limit}");
        let (mut paged, mut after) = (Vec::new(), 0);
        loop {
            let page = store.events_after(a, after, limit).expect("page");
            assert!(page.len() <= limit);
            let Some(last) = page.last() else { break };
            after = last.seq;
            paged.extend(page);
            assert!(
                paged.len() <= 1 + 4 * 5,
                "a page repeats events (limit {limit})"
            );
        }
        assert_eq!(
            paged,
            all_events(&*store, a),
            "a's events in pages of {limit}"
        );
        assert_eq!(paged.len(), 1 + 4 * 5);
    }
}

async fn b1_sessions_and_states_list_their_executions(backend: &dyn Backend) {
    let store = backend.open();
    let session = SessionId::new();
    let mut members = Vec::new();
    for _ in 0..3 {
        let id = ExecutionId::new();
        let mut new = head(id);
        new.session_id = session;
        committed(
            store
                .submit(Transition::create(new, vec![decided("admitted")]))
                .await
                .expect("create"),
        );
        members.push(id);
    }
    let other = create(&*store).await;
    members.sort();
    assert_eq!(
        store.executions_in_session(session).expect("session"),
        members
    );
    let sessions = store.sessions().expect("sessions");
    assert!(sessions.contains(&(session, 3)));
    assert_eq!(sessions.len(), 2);
    set_state(&*store, members[0], 1, ExecutionState::Paused).await;
    set_state(&*store, other, 1, ExecutionState::Completed).await;
    assert_eq!(
        store
            .executions_in_state(ExecutionState::Paused)
            .expect("paused"),
        vec![members[0]]
    );
    assert_eq!(
        store
            .executions_in_state(ExecutionState::Completed)
            .expect("terminal"),
        Vec::new(),
        "terminal states are not indexed"
    );
}

/// Steps a purge until it is done (a step may find it unsettled while the sled store's
/// overlay still holds it; each group commit materializes under `eager_limits`).
async fn purge_fully(store: &dyn EventStore, execution_id: ExecutionId) -> PurgeStep {
    for _ in 0..1000 {
        match store.purge(execution_id, None, None).await.expect("purge") {
            PurgeStep::More | PurgeStep::Unsettled => {
                append(store, create(store).await, 1, "a group to settle it").await;
            }
            step => return step,
        }
    }
    panic!("the purge of {execution_id} never finished");
}

async fn s8_a_purge_removes_an_ended_execution_and_refuses_the_rest(backend: &dyn Backend) {
    let store = backend.open();
    let running = create(&*store).await;
    let gone = create(&*store).await;
    let kept = create(&*store).await;
    let receipt = ReceiptRecord {
        effect_id: EffectId::new(),
        execution_id: gone,
        attempt_id: None,
        epoch: 0,
        tool: "append".into(),
        status: ReceiptStatus::Confirmed,
        output: None,
    };
    let transition = Transition::new(gone, vec![decided("tool done")])
        .expect_version(1)
        .with(Upsert::Receipt(receipt.clone()));
    committed(store.submit(transition).await.expect("receipt"));
    set_state(&*store, gone, 2, ExecutionState::Completed).await;
    set_state(&*store, kept, 1, ExecutionState::Completed).await;
    // Reopened: the sled store lists an ended execution once its head is written to its
    // own key (materialized), which every open does.
    drop(store);
    let store = backend.open();
    let ended: Vec<ExecutionId> = store
        .ended_before(u64::MAX, None, 100)
        .expect("ended")
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert!(ended.contains(&gone) && ended.contains(&kept) && !ended.contains(&running));
    let session = store.head(gone).expect("head").expect("gone").session_id;

    assert_eq!(purge_fully(&*store, gone).await, PurgeStep::Done);
    assert_eq!(store.head(gone).expect("head"), None);
    assert_eq!(all_events(&*store, gone), Vec::new());
    assert_eq!(store.receipt(receipt.effect_id).expect("receipt"), None);
    let tombstone = store.purged(gone).expect("purged").expect("a tombstone");
    assert!(tombstone.finished);
    assert_eq!(tombstone.session_id, session);
    assert!(matches!(
        store.submit(Transition::new(gone, vec![decided("late")])).await,
        Err(openprogram_storage::Error::Purged(id)) if id == gone
    ));
    assert!(!store
        .ended_before(u64::MAX, None, 100)
        .expect("ended")
        .iter()
        .any(|(_, id)| *id == gone));
    assert!(store
        .executions_in_session(session)
        .expect("session")
        .is_empty());
    assert_eq!(store.purges_unfinished().expect("unfinished"), Vec::new());
    // What has not ended, or ended after the cutoff, or never existed, stays.
    assert_eq!(
        store.purge(running, None, None).await.expect("running"),
        PurgeStep::NotEnded
    );
    assert_eq!(
        store.purge(kept, None, Some(0)).await.expect("recent"),
        PurgeStep::NotEnded
    );
    assert_eq!(
        store
            .purge(ExecutionId::new(), None, None)
            .await
            .expect("unknown"),
        PurgeStep::Unknown
    );
    assert_eq!(all_events(&*store, kept).len(), 2);
    assert!(store.head(running).expect("head").is_some());
}

async fn s1_a_reopen_keeps_everything_and_starts_a_new_incarnation(backend: &dyn Backend) {
    let (a, events, first) = {
        let store = backend.open();
        let a = create(&*store).await;
        for version in 1..=3 {
            append(&*store, a, version, "kept").await;
        }
        (a, all_events(&*store, a), store.incarnation().number)
    };
    let store = backend.open();
    assert_eq!(all_events(&*store, a), events);
    assert_eq!(store.head(a).expect("head").map(|h| h.version), Some(4));
    assert!(store.incarnation().number > first);
    // Positions go on past where they were.
    let next = append(&*store, a, 4, "after the reopen").await;
    assert!(*next.positions.start() > events.last().expect("events").position);
}

/// N-2: a node registers and renews its lease by the database's clock; a lease of 0 has
/// lapsed at once; a later incarnation under the same node id supersedes the earlier one,
/// whose renewals are refused from then on. The sled store is one process's: it refuses to
/// register a node and lists none.
async fn n2_node_leases_register_renew_lapse_and_are_superseded_by_a_later_incarnation(
    backend: &dyn Backend,
) {
    use std::time::Duration;
    let first = backend.open();
    let minute = Duration::from_secs(60);
    if let Err(error) = first.renew_node("n1", "http://127.0.0.1:1", minute) {
        assert_eq!(error.code(), "single_node_store", "{error}");
        assert!(first.nodes().expect("nodes").nodes.is_empty());
        return;
    }
    let nodes = first.nodes().expect("nodes");
    let n1 = nodes
        .live_owner(first.incarnation().owner_id)
        .expect("n1 is live");
    assert_eq!(
        (n1.node_id.as_str(), n1.url.as_str()),
        ("n1", "http://127.0.0.1:1")
    );
    assert!(n1.lease_expires_at_ms >= nodes.now_ms + 50_000, "{nodes:?}");
    // A lease of 0 has lapsed when read.
    first
        .renew_node("n1", "http://127.0.0.1:1", Duration::ZERO)
        .expect("renew");
    let nodes = first.nodes().expect("nodes");
    assert!(
        nodes.live_owner(first.incarnation().owner_id).is_none(),
        "{nodes:?}"
    );
    // The node restarts (a later incarnation) while the first one still runs.
    let second = backend.open();
    let renewed = second
        .renew_node("n1", "http://127.0.0.1:2", minute)
        .expect("the later incarnation registers");
    assert_eq!(renewed.owner_id, second.incarnation().owner_id);
    let refused = first
        .renew_node("n1", "http://127.0.0.1:1", minute)
        .expect_err("the earlier incarnation is superseded");
    assert_eq!(refused.code(), "node_superseded", "{refused}");
    let nodes = second.nodes().expect("nodes");
    assert_eq!(nodes.nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes.nodes[0].url, "http://127.0.0.1:2");
    assert!(nodes.live_owner(second.incarnation().owner_id).is_some());
    assert!(nodes.live_owner(first.incarnation().owner_id).is_none());
}

/// R07 after a close: writes racing the close are each answered, committed (and found
/// after a reopen) or `closed` (and written nowhere); a write or read after it answers
/// `closed`; a second close is a no-op; the store opens again at once.
async fn r07_close_answers_what_was_queued_refuses_the_rest_and_lets_the_store_open_again(
    backend: &dyn Backend,
) {
    let store: Arc<dyn EventStore> = Arc::from(backend.open());
    let execution_id = create(&*store).await;
    let racing: Vec<_> = (0..20)
        .map(|_| {
            let (store, id) = (Arc::clone(&store), ExecutionId::new());
            let create = Transition::create(head(id), vec![decided("racing")]);
            (id, tokio::spawn(async move { store.submit(create).await }))
        })
        .collect();
    store.close().await.expect("close");
    let mut answered = Vec::new();
    for (id, task) in racing {
        match task.await.expect("the task") {
            Ok(outcome) => answered.push((id, Some(committed(outcome).version))),
            Err(error) => {
                assert_eq!(error.code(), "closed");
                answered.push((id, None));
            }
        }
    }
    let late = store.submit(Transition::new(execution_id, vec![decided("late")]).expect_version(1));
    assert_eq!(late.await.expect_err("closed").code(), "closed");
    assert_eq!(
        store.head(execution_id).expect_err("closed").code(),
        "closed"
    );
    store.close().await.expect("a second close");

    let reopened = backend.open();
    let version = |id| reopened.head(id).expect("read").map(|head| head.version);
    assert_eq!(version(execution_id), Some(1));
    for (id, answer) in answered {
        assert_eq!(version(id), answer, "what was answered is what is stored");
    }
}
