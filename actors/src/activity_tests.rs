//! The product document's tables as tests of the Activity projection: "How branches are
//! counted", "Which status should I see?" and "Implementation and verification" (B-1..B-5).

use openprogram_storage::{ExecutionId, ExecutionState, MessageId};

use crate::activity::{project, Activity, BranchRow, ExecutionFacts};

/// An execution answering `parent` (a previous reply, or none for a first message).
fn turn(parent: Option<MessageId>, state: ExecutionState) -> ExecutionFacts {
    ExecutionFacts {
        execution_id: ExecutionId::new(),
        parent_execution_id: None,
        child_task: false,
        user_message_id: MessageId::new(),
        reply_message_id: MessageId::new(),
        parent_message_id: parent,
        request: format!("request {}", MessageId::new()),
        state,
        capabilities: Vec::new(),
        pending_wait: false,
        declined_wait: false,
        running_processes: 0,
        response_record_incomplete: false,
        pending_controls: Vec::new(),
    }
}

/// Another reply to the same user message: a fork or retry of `of`.
fn fork(of: &ExecutionFacts, state: ExecutionState) -> ExecutionFacts {
    ExecutionFacts {
        parent_execution_id: Some(of.execution_id),
        user_message_id: of.user_message_id,
        parent_message_id: of.parent_message_id,
        ..turn(None, state)
    }
}

fn counts(activity: &Activity) -> (usize, usize, usize) {
    (
        activity.needs_attention.len(),
        activity.in_progress.len(),
        activity.history.len(),
    )
}

fn only(rows: &[BranchRow]) -> &BranchRow {
    assert_eq!(rows.len(), 1, "{rows:#?}");
    &rows[0]
}

use ExecutionState::{Completed, Expired, Failed, Paused, Running, Waiting};

#[test]
fn b2_one_linear_conversation_is_history_1() {
    let first = turn(None, Completed);
    let activity = project(&[first]);
    assert_eq!(counts(&activity), (0, 0, 1));
    assert_eq!(only(&activity.history).executions, 1);
}

/// "Send a message, then say continue" → 1: both executions stay in the same branch.
#[test]
fn b2_continue_on_the_same_branch_stays_1() {
    let first = turn(None, Completed);
    let second = turn(Some(first.reply_message_id), Completed);
    let activity = project(&[first.clone(), second]);
    assert_eq!(counts(&activity), (0, 0, 1));
    let row = only(&activity.history);
    assert_eq!(row.executions, 2);
    // The branch keeps its id as it grows.
    let alone = project(&[first]);
    assert_eq!(row.branch_id, only(&alone.history).branch_id);
}

/// "Create an alternative reply from an earlier point" → 2.
#[test]
fn b2_a_fork_makes_2() {
    let first = turn(None, Completed);
    let before = only(&project(std::slice::from_ref(&first)).history).branch_id;
    let child = fork(&first, Completed);
    let activity = project(&[first, child]);
    assert_eq!(counts(&activity), (0, 0, 2));
    // The original branch keeps its id; the fork has its own.
    let ids: Vec<MessageId> = activity.history.iter().map(|row| row.branch_id).collect();
    assert!(ids.contains(&before));
    assert_ne!(ids[0], ids[1]);
}

#[test]
fn b2_three_tips_are_history_3() {
    let first = turn(None, Completed);
    let tips: Vec<ExecutionFacts> = (0..3)
        .map(|_| turn(Some(first.reply_message_id), Completed))
        .collect();
    let mut all = vec![first];
    all.extend(tips);
    assert_eq!(counts(&project(&all)), (0, 0, 3));
}

/// "A later execution on the same branch fails" → 1, the failure kept in details.
#[test]
fn b2_a_later_failure_stays_1_with_the_failure_in_details() {
    let first = turn(None, Completed);
    let failed = turn(Some(first.reply_message_id), Failed);
    let activity = project(&[first, failed.clone()]);
    assert_eq!(counts(&activity), (0, 0, 1));
    let row = only(&activity.history);
    assert_eq!(row.status, "failed");
    assert_eq!(
        row.details.last().map(|d| d.execution_id),
        Some(failed.execution_id)
    );
    assert_eq!(row.details.last().map(|d| d.label.as_str()), Some("Failed"));
}

/// "Two branches share earlier messages" → 2 rows; the shared execution in both details.
#[test]
fn b2_two_branches_sharing_earlier_messages_are_2_rows_with_shared_executions_in_both() {
    let shared = turn(None, Completed);
    let left = turn(Some(shared.reply_message_id), Completed);
    let right = turn(Some(shared.reply_message_id), Completed);
    let activity = project(&[shared.clone(), left, right]);
    assert_eq!(counts(&activity), (0, 0, 2));
    for row in &activity.history {
        assert_eq!(row.executions, 2);
        assert_eq!(row.details[0].execution_id, shared.execution_id);
    }
}

/// "A real approval remains visible", and a new message on the branch does not dismiss it.
#[test]
fn b3_a_real_approval_stays_visible_and_a_new_message_does_not_dismiss_it() {
    let mut asking = turn(None, Waiting);
    asking.pending_wait = true;
    let activity = project(&[asking.clone()]);
    let row = only(&activity.needs_attention);
    assert_eq!(row.label, "Waiting for your response");
    assert_eq!(row.details[0].label, "Waiting for your response");
    let newer = turn(Some(asking.reply_message_id), Completed);
    let activity = project(&[asking, newer]);
    assert_eq!(counts(&activity), (1, 0, 0));
}

/// "An ended model request alone does not request confirmation" (B-4): History, never
/// `completed`; an old Cancel request does not make it actionable, another pending control
/// does; Cancel is offered only while a child task is active.
#[test]
fn b4_an_ended_model_request_alone_asks_for_nothing() {
    let mut ended = turn(None, Expired);
    ended.response_record_incomplete = true;
    ended.capabilities = vec!["continue", "step", "steer", "cancel"];
    let activity = project(std::slice::from_ref(&ended));
    let row = only(&activity.history);
    assert_eq!(row.label, "Ended · response record incomplete");
    assert_eq!(row.status, "ended");
    assert!(row.controls.is_empty(), "{:?}", row.controls);
    // An old Cancel request, accepted and never decided: still History.
    let mut old_cancel = ended.clone();
    old_cancel.pending_controls = vec!["cancel"];
    assert_eq!(counts(&project(&[old_cancel])), (0, 0, 1));
    // A pending Continue is actionable: the row needs attention again.
    let mut continuing = ended.clone();
    continuing.pending_controls = vec!["cancel", "continue"];
    assert_eq!(counts(&project(&[continuing])), (1, 0, 0));
}

#[test]
fn b4_cancel_is_offered_only_while_a_child_task_is_active_and_a_fork_is_not_one() {
    let mut ended = turn(None, Expired);
    ended.response_record_incomplete = true;
    // A fork is independent: its own branch, nothing offered on the original's row.
    let fork_child = fork(&ended, Running);
    let activity = project(&[ended.clone(), fork_child]);
    assert_eq!(counts(&activity), (0, 1, 1), "{activity:#?}");
    assert!(activity.history[0].controls.is_empty());
    // A running child task: the ended row offers Cancel, and stays in History.
    let task = ExecutionFacts {
        parent_execution_id: Some(ended.execution_id),
        child_task: true,
        ..turn(None, Running)
    };
    let activity = project(&[ended, task]);
    let ended_row = activity
        .history
        .iter()
        .find(|row| row.label == "Ended · response record incomplete")
        .expect("the ended row");
    assert_eq!(ended_row.controls, vec!["cancel"]);
}

/// B-3/B-4: an unknown effect on an older execution of the branch keeps it actionable, and
/// an owned process keeps an incomplete-response branch out of History (P-2).
#[test]
fn b3_an_older_unresolved_effect_needs_attention_and_a_process_outranks_b4() {
    let unknown = turn(None, ExecutionState::ReconciliationRequired);
    let newer = turn(Some(unknown.reply_message_id), Completed);
    let activity = project(&[unknown, newer]);
    assert_eq!(counts(&activity), (1, 0, 0));
    assert_eq!(activity.needs_attention[0].label, "Unresolved tool result");
    // With a process still running, the branch has not ended: never History. Expired, it
    // needs a person (Continue) before anything else.
    let mut ended = turn(None, Expired);
    ended.response_record_incomplete = true;
    ended.running_processes = 1;
    let activity = project(&[ended]);
    assert!(activity.history.is_empty(), "{activity:#?}");
    assert_eq!(counts(&activity), (1, 0, 0));
}

/// Headings keep their numbers as another branch grows.
#[test]
fn b5_a_branch_keeps_its_heading_as_another_grows() {
    let root = turn(None, Completed);
    let child = fork(&root, Completed);
    let before = project(&[root.clone(), child.clone()]);
    let heading_of = |activity: &Activity, id: MessageId| {
        activity
            .history
            .iter()
            .find(|row| row.branch_id == id)
            .map(|row| row.heading.clone())
    };
    let (first, second) = (before.history[0].branch_id, before.history[1].branch_id);
    let grown = turn(Some(root.reply_message_id), Completed);
    let after = project(&[root, child, grown]);
    assert_eq!(heading_of(&before, first), heading_of(&after, first));
    assert_eq!(heading_of(&before, second), heading_of(&after, second));
}

/// "An Agent finishing its reply does not mean its background process has stopped."
#[test]
fn b3_an_owned_process_keeps_a_finished_branch_in_progress() {
    let mut done = turn(None, Completed);
    done.running_processes = 1;
    let row = only(&project(&[done]).in_progress).clone();
    assert_eq!(row.label, "Process running");
    assert_eq!(row.status, "completed");
}

#[test]
fn b3_a_pause_or_an_expired_continuation_needs_attention_and_running_work_is_in_progress() {
    assert_eq!(counts(&project(&[turn(None, Paused)])), (1, 0, 0));
    assert_eq!(counts(&project(&[turn(None, Expired)])), (1, 0, 0));
    assert_eq!(counts(&project(&[turn(None, Running)])), (0, 1, 0));
}

/// B-1: a parent that was never recorded is never guessed into a new branch: two turns
/// answering the same missing message are two tips of one unknown point, one turn is one.
#[test]
fn b1_a_missing_parent_record_never_guesses_a_branch() {
    let missing = MessageId::new();
    let one = turn(Some(missing), Completed);
    let next = turn(Some(one.reply_message_id), Completed);
    let activity = project(&[one, next]);
    assert_eq!(counts(&activity), (0, 0, 1));
    assert_eq!(only(&activity.history).executions, 2);
}

/// B-5: the heading is short and never the request; declined waits read Declined.
#[test]
fn b5_the_request_appears_only_in_its_execution_row_and_declined_reads_declined() {
    let mut declined = turn(None, Completed);
    declined.declined_wait = true;
    let activity = project(&[declined.clone()]);
    let row = only(&activity.history);
    assert!(!row.heading.contains(&declined.request), "{}", row.heading);
    assert!(row.heading.len() <= 24, "{}", row.heading);
    assert_eq!(row.details[0].request, declined.request);
    assert_eq!(row.details[0].label, "Declined");
}

/// B-2: a function an agent's call started is a child task on its caller's branch, never a
/// branch of its own; the row counts it apart and lists it after its caller. One whose
/// caller is not recorded in the session stays a branch (missing records never guess).
#[test]
fn b2_a_child_task_is_listed_under_its_callers_branch_and_is_no_branch() {
    let caller = turn(None, Completed);
    let task = ExecutionFacts {
        parent_execution_id: Some(caller.execution_id),
        child_task: true,
        ..turn(None, Running)
    };
    let later = turn(Some(caller.reply_message_id), Completed);
    let activity = project(&[caller.clone(), task.clone(), later.clone()]);
    assert_eq!(counts(&activity), (0, 1, 0), "{activity:#?}");
    let row = &activity.in_progress[0];
    assert_eq!((row.executions, row.child_tasks), (2, 1));
    let details: Vec<_> = row
        .details
        .iter()
        .map(|detail| (detail.execution_id, detail.child_of))
        .collect();
    let expected = [
        (caller.execution_id, None),
        (task.execution_id, Some(caller.execution_id)),
        (later.execution_id, None),
    ];
    assert_eq!(details, expected);
    assert_eq!(counts(&project(&[task])), (0, 1, 0));
}

/// B-2 with B-3: a child task that waits for a person, is paused or has an unknown effect
/// puts its caller's branch in Needs attention, though its caller only waits for the call.
#[test]
fn b2_a_child_task_that_needs_a_person_puts_its_callers_branch_in_attention() {
    let caller = turn(None, Running);
    let child = |state| ExecutionFacts {
        parent_execution_id: Some(caller.execution_id),
        child_task: true,
        ..turn(None, state)
    };
    let asking = ExecutionFacts {
        pending_wait: true,
        ..child(ExecutionState::Waiting)
    };
    for (task, label) in [
        (asking, "Waiting for your response"),
        (child(ExecutionState::Paused), "Child task paused"),
        (
            child(ExecutionState::ReconciliationRequired),
            "Unresolved tool result",
        ),
    ] {
        let activity = project(&[caller.clone(), task]);
        assert_eq!(counts(&activity), (1, 0, 0), "{activity:#?}");
        assert_eq!(activity.needs_attention[0].label, label);
    }
}
