//! Tests of the typed command (`command.rs`): X-3 refusals, K-4 round trips and payload
//! hashes, and commands stored before schema 6 matching their retries.

use super::*;

fn parse(body: Value) -> Result<Command> {
    Command::from_json(&body)
}

/// a field the kind does not take, a kind not built and a kind that does not
/// exist are refused with their codes, naming what was wrong.
#[test]
fn x3_unknown_fields_and_kinds_are_refused() {
    let id = CommandId::new();
    let error = parse(json!({"command_id": id, "kind": "pause", "text": "x"})).unwrap_err();
    assert_eq!(error.code(), "unknown_field");
    assert!(error.to_string().contains("`text`"), "{error}");
    let error = parse(json!({"command_id": id, "kind": "steer", "text": "x", "max_iteration": 3}))
        .unwrap_err();
    assert_eq!(error.code(), "unknown_field");
    assert!(error.to_string().contains("max_iteration"), "{error}");
    let error =
        parse(json!({"command_id": id, "kind": "set_policy", "policy": "newest"})).unwrap_err();
    assert_eq!(error.code(), "invalid_request");
    let error = parse(json!({"command_id": id, "kind": "set_policy"})).unwrap_err();
    assert_eq!(error.code(), "invalid_request");
    let error = parse(json!({"command_id": id, "kind": "pasue"})).unwrap_err();
    assert_eq!(error.code(), "unknown_kind");
    let error = parse(json!({"command_id": id, "kind": "steer"})).unwrap_err();
    assert_eq!(error.code(), "invalid_request");
    let error = parse(json!({"kind": "pause"})).unwrap_err();
    assert_eq!(error.code(), "invalid_request");
    let error = parse(json!({"command_id": id, "kind": "answer"})).unwrap_err();
    assert_eq!(
        error.code(),
        "invalid_request",
        "an answer is pinned to a wait or a version"
    );
}

/// K-4 across the schema-6 upgrade: a command stored by an earlier build (whose hash is
/// computed here as that build did, `payload_hash_of` of 220bd22) matches the same
/// command sent again; another command does not.
#[test]
fn k4_a_command_stored_before_schema_6_matches_its_retry() {
    fn old_hash(
        kind: &str,
        text: Option<&str>,
        version: Option<u64>,
        fields: &[(&str, Option<String>)],
    ) -> [u8; 32] {
        let mut canonical = json!({"kind": kind, "text": text, "expected_version": version});
        for (name, value) in fields {
            if let Some(value) = value {
                canonical[*name] = json!(value);
            }
        }
        *blake3::hash(canonical.to_string().as_bytes()).as_bytes()
    }
    let wait_id = WaitId::new();
    let answer = Command::from_json(&json!({
        "command_id": CommandId::new(), "kind": "answer", "wait_id": wait_id
    }))
    .expect("answer");
    let stored = old_hash(
        "answer",
        None,
        None,
        &[("wait_id", Some(wait_id.to_string()))],
    );
    assert!(answer.matches_payload(&stored));
    let spelled = old_hash(
        "answer",
        None,
        None,
        &[
            ("wait_id", Some(wait_id.to_string())),
            ("answer", Some(String::new())),
            ("scope", Some("operation".into())),
        ],
    );
    assert!(answer.matches_payload(&spelled));
    let pause = Command::new(CommandBody::Pause).expecting(4);
    assert!(pause.matches_payload(&old_hash("pause", None, Some(4), &[])));
    assert!(!pause.matches_payload(&old_hash("pause", None, Some(5), &[])));
    assert!(!pause.matches_payload(&old_hash("continue", None, Some(4), &[])));
    let reconcile = Command::new(CommandBody::Reconcile {
        effect: EffectRef::Id(EffectId::new()),
        outcome: ReconcileOutcome::Confirmed,
        text: "out".into(),
    });
    let protocol = old_hash(
        "reconcile",
        Some("out"),
        None,
        &[("outcome", Some("confirmed".into()))],
    );
    assert!(reconcile.matches_payload(&protocol));
}

/// K-4: every command reads back from the body it writes, and the payload hash
/// ignores the id and spelled-out defaults but nothing that changes the meaning.
#[test]
fn k4_a_command_round_trips_and_hashes_its_meaning() {
    let bodies = [
        CommandBody::Pause,
        CommandBody::Continue {
            policy: None,
            budget: None,
        },
        CommandBody::Continue {
            policy: None,
            budget: Some(openprogram_storage::JobBudget {
                steps: Some(5),
                wall_ms: None,
            }),
        },
        CommandBody::Step,
        CommandBody::Cancel,
        CommandBody::Retry,
        CommandBody::Steer {
            text: "left".into(),
        },
        CommandBody::Fork {
            checkpoint: Some(4),
        },
        CommandBody::Fork { checkpoint: None },
        CommandBody::Answer {
            wait: WaitRef::Id(WaitId::new()),
            answer: "yes".into(),
            scope: AnswerScope::Discussion,
        },
        CommandBody::Decline {
            wait: WaitRef::Id(WaitId::new()),
        },
        CommandBody::Reconcile {
            effect: EffectRef::Unresolved,
            outcome: ReconcileOutcome::Confirmed,
            text: "out".into(),
        },
        CommandBody::StopProcess {
            process_id: ProcessId::new(),
        },
    ];
    let mut hashes = std::collections::HashSet::new();
    for body in bodies {
        let command = Command::new(body).expecting(3);
        let read = Command::from_json(&command.to_json()).expect("reads back");
        assert_eq!(read, command);
        assert_eq!(
            read.clone().with_id(CommandId::new()).payload_hash(),
            command.payload_hash()
        );
        assert_ne!(
            command.clone().expecting(4).payload_hash(),
            command.payload_hash()
        );
        assert!(hashes.insert(command.payload_hash()), "{command:?}");
    }
    let id = CommandId::new();
    let short = parse(json!({"command_id": id, "kind": "answer", "wait_id": WaitId::new()}));
    let short = short.expect("answer");
    let mut spelled = short.to_json();
    spelled["scope"] = json!("operation");
    spelled["answer"] = json!("");
    assert_eq!(
        Command::from_json(&spelled)
            .expect("spelled")
            .payload_hash(),
        short.payload_hash()
    );
}

/// J-1, X-3: a Continue's `budget` — a field it does not have is `unknown_field`, named by
/// its path; a value that is no whole number (or a step count past u32) `invalid_request`.
#[test]
fn j1_a_continue_budget_is_read_strictly() {
    let id = CommandId::new();
    let code = |budget: Value| {
        parse(json!({"command_id": id, "kind": "continue", "budget": budget}))
            .map(|_| "ok")
            .unwrap_or_else(|error| error.code())
    };
    assert_eq!(code(json!({"steps": 3, "wall_ms": null})), "ok");
    assert_eq!(code(json!({"tokens": 3})), "unknown_field");
    assert_eq!(code(json!({"steps": "3"})), "invalid_request");
    assert_eq!(code(json!({"steps": 5_000_000_000u64})), "invalid_request");
    assert_eq!(code(json!([3])), "invalid_request");
    let refused = parse(json!({"command_id": id, "kind": "pause", "budget": {"steps": 1}}));
    assert_eq!(refused.map(|_| ()).unwrap_err().code(), "unknown_field");
}

/// The kinds' table is in the enum's order: each kind reads back from its own name.
#[test]
fn each_kind_reads_back_from_its_name() {
    for (at, kind) in CommandKind::ALL.into_iter().enumerate() {
        assert_eq!(kind as usize, at, "{kind}");
        assert_eq!(CommandKind::parse(kind.as_str()), Some(kind));
        assert_eq!(json!(kind), json!(kind.as_str()));
    }
}
