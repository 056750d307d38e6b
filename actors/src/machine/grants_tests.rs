//! Table tests of approval scopes in the pure machine (W-7).

use openprogram_storage::{
    AnswerScope, Control, EffectId, Event, ExecutionId, ExecutionState as Status, ReceiptStatus,
    SessionRecord, WaitId,
};

use super::tests::{commit, control, ctl, offered, running, tool_decision};
use super::wait_types::wait_of;
use super::*;

/// The model asks approval for `tool` (its request names it); the events, as decided.
fn ask_for(machine: &mut Machine, tool: &str, session: Option<&SessionRecord>) -> Vec<Event> {
    let decision = Decision::Ask {
        prompt: format!("run {tool}?"),
        wait: Some(AskDetails {
            kind: AskKind::Approval,
            request: Some(serde_json::json!({ "tool": tool })),
            timeout_ms: None,
        }),
    };
    let (events, _) = machine.decide_decision(EffectId::new(), decision, 0, session);
    commit(machine, &events);
    events
}

/// The model calls `tool` and it succeeds.
fn call(machine: &mut Machine, tool: &str) -> EffectId {
    let (events, _) = machine.decide_decision(EffectId::new(), tool_decision(tool), 0, None);
    commit(machine, &events);
    let effect_id = machine
        .present
        .calls
        .pending_tool
        .as_ref()
        .expect("pending")
        .effect_id;
    let events = machine
        .decide(Input::ToolFinished {
            effect_id,
            status: ReceiptStatus::Confirmed,
            output: "ok".into(),
        })
        .expect("result");
    commit(machine, &events);
    effect_id
}

fn answer(wait_id: WaitId, scope: AnswerScope) -> Control {
    Control::Answer {
        wait_id,
        answer: String::new(),
        scope,
    }
}

fn grant_used(events: &[Event]) -> Option<(WaitId, Option<u64>)> {
    events.iter().find_map(|event| match event {
        Event::GrantUsed {
            grant_id,
            session_version,
            ..
        } => Some((*grant_id, *session_version)),
        _ => None,
    })
}

fn pending_wait(machine: &Machine) -> WaitId {
    machine
        .present
        .waits
        .pending_wait()
        .expect("a wait")
        .wait_id
}

#[test]
fn w7_a_tool_scope_approves_that_tool_for_the_execution_and_nothing_wider() {
    let mut machine = running(50);
    assert!(grant_used(&ask_for(&mut machine, "append", None)).is_none());
    let first = pending_wait(&machine);
    ctl(&mut machine, answer(first, AnswerScope::Tool), false);
    let effect = call(&mut machine, "append");
    assert_eq!(
        machine.relied_on,
        vec![(effect, first)],
        "the receipt keeps its approval"
    );

    // The same tool again: no wait, the grant relied on, the call keeps it.
    let events = ask_for(&mut machine, "append", None);
    assert_eq!(grant_used(&events), Some((first, None)));
    assert_eq!(machine.status(), Status::Running);
    assert!(machine.present.waits.pending_wait().is_none());
    let again = call(&mut machine, "append");
    assert_eq!(machine.relied_on.last(), Some(&(again, first)));

    // Another tool: a wait of its own. Its operation answer approves one call only.
    ask_for(&mut machine, "shell", None);
    let shell = pending_wait(&machine);
    ctl(&mut machine, answer(shell, AnswerScope::Operation), false);
    call(&mut machine, "shell");
    assert!(
        grant_used(&ask_for(&mut machine, "shell", None)).is_none(),
        "never widens"
    );
    assert_eq!(machine.status(), Status::Waiting);
}

#[test]
fn w7_a_revoked_grant_never_approves_again() {
    let mut machine = running(50);
    ask_for(&mut machine, "append", None);
    let grant = pending_wait(&machine);
    ctl(&mut machine, answer(grant, AnswerScope::Tool), false);
    call(&mut machine, "append");
    assert!(offered(&machine).contains(&crate::command::CommandKind::Revoke));
    ctl(&mut machine, Control::Revoke { grant_id: grant }, false);
    assert!(!offered(&machine).contains(&crate::command::CommandKind::Revoke));
    assert!(grant_used(&ask_for(&mut machine, "append", None)).is_none());
    assert_eq!(machine.status(), Status::Waiting, "a new wait");
    let twice = control(&machine, Control::Revoke { grant_id: grant }, false);
    assert_eq!(
        twice.map_err(|rejection| rejection.code()),
        Err("not_available")
    );
    let unknown = machine.present.waits.decide_revoke(
        openprogram_storage::CommandId::new(),
        WaitId::new(),
        None,
    );
    assert_eq!(
        unknown.map_err(|refusal| refusal.code()),
        Err("unknown_grant")
    );
}

#[test]
fn w7_a_session_grant_covers_the_sessions_other_executions_at_the_version_read() {
    let mut granting = running(50);
    ask_for(&mut granting, "append", None);
    let grant = pending_wait(&granting);
    let given = answer(grant, AnswerScope::Session);
    let me = ExecutionId::new();
    let session = granting
        .session_after(&given, me, SessionRecord::default())
        .expect("a session grant");
    assert_eq!(session.grants.len(), 1);
    assert_eq!(
        (
            session.grants[0].tool.as_str(),
            session.grants[0].granted_by
        ),
        ("append", me)
    );
    ctl(&mut granting, given, false);
    let mut session = SessionRecord {
        version: 4,
        ..session
    };

    // Another execution of the session: approved without a wait, at version 4.
    let mut other = running(50);
    let events = ask_for(&mut other, "append", Some(&session));
    assert_eq!(grant_used(&events), Some((grant, Some(4))));
    // Any execution of the session may revoke it (the one that gave it may be purged).
    let offered_to_other = |session: &SessionRecord| other.present.waits.has_grant(Some(session));
    assert!(offered_to_other(&session));
    let revoke = Control::Revoke { grant_id: grant };
    let command = openprogram_storage::CommandId::new();
    assert!(other
        .present
        .waits
        .decide_revoke(command, grant, Some(&session))
        .is_ok());
    session = other
        .session_after(&revoke, ExecutionId::new(), session)
        .expect("revoked");
    assert!(!offered_to_other(&session));
    assert_eq!(
        other
            .present
            .waits
            .decide_revoke(command, grant, Some(&session))
            .map_err(|refusal| refusal.code()),
        Err("grant_revoked")
    );
    assert!(session.grants[0].revoked);
    let mut third = running(50);
    assert!(grant_used(&ask_for(&mut third, "append", Some(&session))).is_none());
    assert_eq!(third.status(), Status::Waiting);
    // An execution grant is no session grant: nothing to write for it.
    let mut own = running(50);
    ask_for(&mut own, "append", None);
    let wait = pending_wait(&own);
    assert!(own
        .session_after(
            &answer(wait, AnswerScope::Tool),
            me,
            SessionRecord::default()
        )
        .is_none());
}

#[test]
fn w7_a_grant_covers_only_the_tool_it_names_and_a_question_approves_no_call() {
    let mut machine = running(50);
    ask_for(&mut machine, "append", None);
    let grant = pending_wait(&machine);
    ctl(&mut machine, answer(grant, AnswerScope::Tool), false);
    // The model calls another tool than the one approved: it runs on no approval.
    let other = call(&mut machine, "echo");
    assert!(machine.relied_on.iter().all(|(effect, _)| *effect != other));
    // A question answered approves no call either.
    let effect_id = EffectId::new();
    let decision = Decision::Ask {
        prompt: "which?".into(),
        wait: Some(AskDetails {
            kind: AskKind::Question,
            request: None,
            timeout_ms: None,
        }),
    };
    let (events, _) = machine.decide_decision(effect_id, decision, 0, None);
    commit(&mut machine, &events);
    ctl(
        &mut machine,
        answer(wait_of(effect_id), AnswerScope::Operation),
        false,
    );
    let after = call(&mut machine, "echo");
    assert!(machine.relied_on.iter().all(|(effect, _)| *effect != after));
}

#[test]
fn w7_a_tool_scope_needs_an_approval_that_names_a_tool() {
    let mut machine = running(50);
    let effect_id = EffectId::new();
    let decision = Decision::Ask {
        prompt: "go?".into(),
        wait: None,
    };
    let (events, _) = machine.decide_decision(effect_id, decision, 0, None);
    commit(&mut machine, &events);
    for scope in [AnswerScope::Tool, AnswerScope::Session] {
        let refused =
            control(&machine, answer(wait_of(effect_id), scope), false).expect_err("refused");
        assert_eq!(refused.code(), "invalid_answer");
        assert!(
            matches!(&refused.refusal, Refusal::InvalidAnswer { field, .. } if field == "scope")
        );
    }
}
