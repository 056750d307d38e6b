//! The context's form (E-8): a branch's turns, then the turn's own, paired and in order.

use std::sync::Arc;

use super::*;
use crate::agent::{AgentInput, ModelRequest, ToolArgs};
use crate::machine::LastPrompt;
use openprogram_storage::{EffectId, ExecutionId};

fn request(earlier: Branch, context: Vec<Turn>) -> ModelRequest {
    ModelRequest {
        execution_id: ExecutionId::new(),
        effect_id: EffectId::new(),
        input: Arc::new(AgentInput {
            message: "hi".into(),
            script: Vec::new(),
            max_iterations: 10,
        }),
        context: Arc::new(context),
        earlier,
        left_out: 0,
        iterations: 0,
        used: Default::default(),
        usage: Default::default(),
        deltas: Default::default(),
    }
}

fn call(tool: &str) -> Turn {
    Turn::Decided(Decision::tool(
        tool.into(),
        ToolArgs::from_text(r#"{"text":"x"}"#).expect("json"),
    ))
}

fn result(output: &str, status: ReceiptStatus) -> Turn {
    Turn::ToolResult {
        tool: "echo".into(),
        status,
        output: output.into(),
    }
}

fn earlier_turn(message: &str, turns: Vec<Turn>) -> Earlier {
    Earlier::Turn(Arc::new(EarlierTurn {
        execution_id: ExecutionId::new(),
        parent_message_id: None,
        reply_message_id: MessageId::new(),
        message: message.into(),
        turns: Arc::new(turns),
    }))
}

#[test]
fn e3_a_regenerated_request_pairs_each_result_with_its_call() {
    let messages = request(
        Branch::default(),
        vec![
            call("echo"),
            result("one", ReceiptStatus::Confirmed),
            call("fail"),
            result("boom", ReceiptStatus::Failed),
            Turn::Steer {
                text: "shorter please".into(),
            },
        ],
    )
    .messages();
    let roles: Vec<Role> = messages.iter().map(|message| message.role).collect();
    assert_eq!(
        roles,
        [
            Role::User,
            Role::Assistant,
            Role::User,
            Role::Assistant,
            Role::User
        ]
    );
    assert!(matches!(&messages[1].parts[0], Part::ToolCall { id, .. } if id == "call00001"));
    assert!(matches!(&messages[2].parts[0],
        Part::ToolResult { id, content, is_error: false } if id == "call00001" && content == "one"));
    assert!(matches!(&messages[4].parts[0],
        Part::ToolResult { id, is_error: true, .. } if id == "call00002"));
    // The steer follows the last result in the same user message.
    assert_eq!(messages[4].parts[1], Part::Text("shorter please".into()));
}

#[test]
fn e8_earlier_turns_come_first_in_order_and_call_ids_run_across_them() {
    let branch = Branch::default()
        .then(earlier_turn(
            "find the files",
            vec![
                call("echo"),
                result("a.log", ReceiptStatus::Confirmed),
                Turn::Decided(Decision::reply("a.log it is".into())),
            ],
        ))
        .then(earlier_turn(
            "and the second",
            vec![call("echo"), result("b.log", ReceiptStatus::Confirmed)],
        ));
    let request = request(branch, vec![call("echo")]);
    assert_eq!(
        digest(&request.messages()),
        [
            "user: find the files",
            r#"assistant: call call00001 echo {"text":"x"}"#,
            "tool call00001: a.log",
            "assistant: a.log it is",
            "user: and the second",
            r#"assistant: call call00002 echo {"text":"x"}"#,
            "tool call00002: b.log",
            "user: hi",
            r#"assistant: call call00003 echo {"text":"x"}"#,
        ]
        .join("\n")
    );
}

#[test]
fn e8_a_steer_stands_where_it_arrived_and_never_between_a_call_and_its_result() {
    let request = request(
        Branch::default(),
        vec![
            Turn::Steer {
                text: "early".into(),
            },
            call("echo"),
            Turn::Steer {
                text: "while it ran".into(),
            },
            result("done", ReceiptStatus::Confirmed),
            Turn::Decided(Decision::reply("ok".into())),
        ],
    );
    assert_eq!(
        digest(&request.messages()),
        [
            "user: hi",
            "user: early",
            r#"assistant: call call00001 echo {"text":"x"}"#,
            "tool call00001: done",
            "user: while it ran",
            "assistant: ok",
        ]
        .join("\n")
    );
}

#[test]
fn e8_a_call_its_turn_never_finished_gets_a_result_before_the_next_message() {
    let branch = Branch::default().then(earlier_turn("cancelled one", vec![call("sleep")]));
    let messages = request(branch, Vec::new()).messages();
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert!(matches!(&messages[2].parts[0],
        Part::ToolResult { id, is_error: true, .. } if id == "call00001"));
    assert_eq!(messages[2].parts[1], Part::Text("hi".into()));
}

#[test]
fn e8_a_summary_opens_the_context_and_a_cut_is_said() {
    let branch = Branch::default()
        .then(Earlier::Summary {
            message_id: MessageId::new(),
            text: "they found a.log".into(),
        })
        .then(earlier_turn("next", Vec::new()));
    let mut request = request(branch, Vec::new());
    request.left_out = 2;
    let text = digest(&request.messages());
    assert!(text.starts_with("user: [2 earlier entries"), "{text}");
    assert!(
        text.contains("user: [A summary of the conversation so far]\nthey found a.log"),
        "{text}"
    );
}

#[test]
fn e8_a_branch_shares_what_it_extends_and_drops_long_chains_without_recursion() {
    let root = Branch::default().then(earlier_turn("one", Vec::new()));
    let longer = root.then(earlier_turn("two", Vec::new()));
    assert_eq!((root.len(), longer.len()), (1, 2));
    assert_eq!(longer.entries()[0], root.entries()[0]);
    assert!(longer.bytes() > root.bytes());
    let mut long = Branch::default();
    for _ in 0..200_000 {
        long = long.then(Earlier::Summary {
            message_id: MessageId::new(),
            text: "".into(),
        });
    }
    drop(long);
}

#[test]
fn e8_an_estimate_starts_from_the_providers_count_of_the_last_request() {
    let branch = Branch::default().then(earlier_turn(&"x".repeat(400), Vec::new()));
    let context = vec![
        call("echo"),
        result(&"y".repeat(80), ReceiptStatus::Confirmed),
    ];
    // No report: a token per four bytes of everything.
    let whole = estimate_tokens(&branch, "hi", &context, None);
    assert_eq!(whole, ((400 + 2 + 4 + 12 + 80) / 4) as u64);
    // A report of the last request: its prompt and response, then what followed the decision.
    let last = LastPrompt {
        input_tokens: 1_000,
        output_tokens: 7,
    };
    assert_eq!(estimate_tokens(&branch, "hi", &context, Some(last)), 1_027);
}

#[test]
fn e8_over_the_budget_compaction_comes_first_then_whole_oldest_entries_are_cut() {
    let turns: Vec<Earlier> = (0..3)
        .map(|_| earlier_turn(&"x".repeat(400), Vec::new()))
        .collect();
    let ids: Vec<ExecutionId> = turns
        .iter()
        .map(|turn| match turn {
            Earlier::Turn(turn) => turn.execution_id,
            Earlier::Summary { .. } => unreachable!("turns only"),
        })
        .collect();
    let branch = turns
        .into_iter()
        .fold(Branch::default(), |branch, turn| branch.then(turn));
    assert_eq!(over_budget(400, 400, &branch, Some(0)), None);
    assert_eq!(
        over_budget(100, 400, &branch, Some(0)),
        Some(OverBudget::Compact { through: ids[2] })
    );
    assert_eq!(
        over_budget(100, 400, &branch, Some(1)),
        Some(OverBudget::Compact { through: ids[1] })
    );
    // Nothing older than the turns kept: cut instead; 150 tokens over is two entries of 100.
    assert_eq!(
        over_budget(250, 400, &branch, Some(3)),
        Some(OverBudget::Cut { entries: 2 })
    );
    assert_eq!(
        over_budget(399, 400, &branch, None),
        Some(OverBudget::Cut { entries: 1 })
    );
    // A turn alone over its budget goes as it is: its own progress is never cut.
    assert_eq!(over_budget(1, 400, &Branch::default(), Some(0)), None);
    assert_eq!(
        branch.without_oldest(2).entries(),
        vec![branch.newest().expect("one")]
    );
}
