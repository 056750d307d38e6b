//! Tests of the codec (`codec.rs`): record and log-record round trips, corruption, the
//! schema-5 command record still read, and R16 decoder fuzzing.

use super::*;
use crate::event::{Event, EventEnvelope};
use crate::ids::{RunId, SessionId};
use crate::records::{CommandRecord, ExecutionHead, ExecutionKind};

/// R16: every decoder of bytes from disk refuses random and mutated input with an
/// error, never a panic or an unbounded allocation. Records and head records get their
/// checksum made valid on purpose, so the decoding behind it runs; a mutated log record
/// keeps its broken checksums (its framing checks run first). Seeded (`OP_FUZZ_SEED`,
/// `OP_FUZZ_CASES`).
#[test]
fn r16_decoders_refuse_random_and_mutated_bytes_without_a_panic() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("OP_FUZZ_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    let cases: usize = std::env::var("OP_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(3000);
    eprintln!("r16 decoders: seed {seed} (replay with OP_FUZZ_SEED={seed}), {cases} cases");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Valid encodings to mutate: a command record, a head record, a log record.
    let head = ExecutionHead::new(
        ExecutionId::new(),
        SessionId::new(),
        RunId::new(),
        ExecutionKind::AgentTurn,
    );
    let record = encode(&RecordValue::Command(CommandRecord {
        command_id: crate::ids::CommandId::new(),
        execution_id: head.execution_id,
        kind: "steer".into(),
        payload_hash: [1; 32],
        status: crate::records::CommandStatus::Rejected,
        reason: Some("why".into()),
        reason_code: Some("not_available".into()),
        result_version: Some(2),
        child_execution_id: None,
        accepted_at_ms: 3,
    }));
    let head_record = crate::head_record::encode(&head, &crate::head_record::HeadIndex::default());
    let mut writer = LogRecordWriter::new();
    let head = ExecutionHead {
        last_seq: 1,
        last_activity_ms: 1,
        ..head
    };
    let frame = Frame {
        head: head.clone(),
        events: vec![EventEnvelope {
            execution_id: head.execution_id,
            seq: 1,
            position: 1,
            at_ms: 1,
            writer_epoch: 0,
            event: Event::Replied { text: "hi".into() },
        }],
        records: Vec::new(),
    };
    let mut frame_bytes = Vec::new();
    encode_frame_into(&mut frame_bytes, &frame, true, &[]);
    writer.push(&frame_bytes);
    let log_record = writer.finish(1);
    let with_crc = |mut body: Vec<u8>| {
        let crc = crc32fast::hash(&body);
        body.extend_from_slice(&crc.to_be_bytes());
        body
    };
    for case in 0..cases {
        let mut bytes = match case % 4 {
            // Random bytes behind a valid version byte and checksum.
            0 => {
                let len = rng.gen_range(0..512);
                let mut body = vec![RECORD_FORMAT_VERSION];
                body.extend((0..len).map(|_| rng.gen::<u8>()));
                with_crc(body)
            }
            1 => record.clone(),
            2 => head_record.clone(),
            _ => log_record.clone(),
        };
        // Mutations: flips, a cut, a length field made huge; then the checksum fixed.
        if case % 4 != 0 && !bytes.is_empty() {
            for _ in 0..rng.gen_range(1..6) {
                let at = rng.gen_range(0..bytes.len());
                bytes[at] = rng.gen();
            }
            if rng.gen_bool(0.3) {
                bytes.truncate(rng.gen_range(0..bytes.len()));
            }
            if case % 4 != 3 && bytes.len() > 4 {
                let body = bytes[..bytes.len() - 4].to_vec();
                bytes = with_crc(body);
            }
        }
        let _ = decode::<RecordValue>(b"\x05k", &bytes);
        let _ = crate::head_record::decode(b"\x03k", &bytes);
        let _ = decode_log_record(&crate::keys::log(1), &bytes);
    }
}

/// S-1: a command record as schemas 1..=5 stored it (variant 0, no `reason_code`) is
/// still read; a new one is written as variant 4 and read back whole.
#[test]
fn s1_command_records_of_schema_5_are_still_read() {
    use crate::ids::CommandId;
    use crate::records::CommandStatus;
    #[derive(Serialize)]
    enum Old {
        Command {
            command_id: CommandId,
            execution_id: ExecutionId,
            kind: String,
            payload_hash: [u8; 32],
            status: CommandStatus,
            reason: Option<String>,
            result_version: Option<u64>,
            child_execution_id: Option<ExecutionId>,
            accepted_at_ms: u64,
        },
    }
    let record = CommandRecord {
        command_id: CommandId::new(),
        execution_id: ExecutionId::new(),
        kind: "pause".into(),
        payload_hash: [3; 32],
        status: CommandStatus::Rejected,
        reason: Some("no".into()),
        reason_code: None,
        result_version: Some(4),
        child_execution_id: None,
        accepted_at_ms: 9,
    };
    let old = encode(&Old::Command {
        command_id: record.command_id,
        execution_id: record.execution_id,
        kind: record.kind.clone(),
        payload_hash: record.payload_hash,
        status: record.status,
        reason: record.reason.clone(),
        result_version: record.result_version,
        child_execution_id: record.child_execution_id,
        accepted_at_ms: record.accepted_at_ms,
    });
    let read: RecordValue = decode(b"\x05k", &old).expect("an old command record");
    assert_eq!(read, RecordValue::Command(record.clone()));
    let new = RecordValue::Command(CommandRecord {
        reason_code: Some("not_available".into()),
        ..record
    });
    let bytes = encode(&new);
    assert_eq!(bytes[1..5], 4u32.to_le_bytes(), "variant 4");
    assert_eq!(decode::<RecordValue>(b"\x05k", &bytes).ok(), Some(new));
}

#[test]
fn record_round_trips_and_any_flipped_byte_is_corruption() {
    let value = (42u64, String::from("hello"));
    let bytes = encode(&value);
    assert_eq!(decode::<(u64, String)>(b"\x05k", &bytes).ok(), Some(value));
    for index in 0..bytes.len() {
        let mut flipped = bytes.clone();
        flipped[index] ^= 0x40;
        match decode::<(u64, String)>(b"\x05k", &flipped) {
            Err(Error::Corrupted {
                tree: "commands", ..
            }) => {}
            other => panic!("flip at {index} decoded as {other:?}"),
        }
    }
    assert!(decode::<u64>(b"\x05", &[]).is_err());
}

#[test]
fn log_record_frames_fail_one_at_a_time() {
    let frame = |n: u64| Frame {
        head: {
            let mut head = ExecutionHead::new(
                ExecutionId::new(),
                SessionId::new(),
                RunId::new(),
                ExecutionKind::Job,
            );
            head.version = n;
            head.last_seq = 1;
            head
        },
        events: vec![EventEnvelope {
            execution_id: ExecutionId::from_bytes([0; 16]),
            seq: 1,
            position: n + 5,
            at_ms: 0,
            writer_epoch: 0,
            event: Event::Replied { text: "hi".into() },
        }],
        records: vec![],
    };
    let owned = |mut frame: Frame| {
        frame.events[0].execution_id = frame.head.execution_id;
        frame
    };
    let (first, second) = (owned(frame(1)), owned(frame(2)));
    let mut writer = LogRecordWriter::new();
    writer.push(&encode_frame(&first, true, &[]));
    let first_len = writer.len();
    writer.push(&encode_frame(&second, true, &[]));
    let mut bytes = writer.finish(7);
    let header_flipped = {
        let mut bytes = bytes.clone();
        bytes[8] ^= 0x01;
        bytes
    };
    assert!(decode_log_record(&keys::log(1), &header_flipped).is_err());
    // Flip a byte in the first frame's payload: only that frame is corrupt.
    bytes[first_len - 3] ^= 0xff;
    let record = decode_log_record(&keys::log(1), &bytes).expect("framing intact");
    assert_eq!(record.last_position, 7);
    let frames = record.frames;
    assert!(
        matches!(&frames[0], DecodedFrame::Corrupt { claimed } if *claimed == first.head.execution_id)
    );
    assert!(
        matches!(&frames[1], DecodedFrame::Ok(frame) if frame.clone().complete(None) == Some(second))
    );
    // A length running past the end is a broken record.
    bytes[LOG_HEADER_LEN] = 0xff;
    assert!(matches!(
        decode_log_record(&keys::log(1), &bytes),
        Err(Error::Corrupted { tree: "log", .. })
    ));
}

/// A frame as the committer builds it: `n` events from seq 5, position 40.
fn frame_with_events(n: u64) -> Frame {
    let mut head = ExecutionHead::new(
        ExecutionId::new(),
        SessionId::new(),
        RunId::new(),
        ExecutionKind::AgentTurn,
    );
    head.version = 3;
    head.last_seq = 4 + n;
    head.last_activity_ms = 1_700;
    head.pause_reason = Some("step".into());
    let events = (0..n)
        .map(|index| EventEnvelope {
            execution_id: head.execution_id,
            seq: 5 + index,
            position: 40 + index,
            at_ms: 1_700,
            writer_epoch: 2,
            event: Event::CheckpointPublished {
                checkpoint_seq: 5 + index,
            },
        })
        .collect();
    Frame {
        head,
        events,
        records: vec![],
    }
}

fn decode_one(version: u8, frame_bytes: &[u8]) -> StoredFrame {
    match decode_one_frame(version, frame_bytes) {
        DecodedFrame::Ok(frame) => *frame,
        corrupt => panic!("expected a readable frame, got {corrupt:?}"),
    }
}

/// `frame_bytes` as the one frame of a log record of format `version`, read back.
fn decode_one_frame(version: u8, frame_bytes: &[u8]) -> DecodedFrame {
    let mut writer = LogRecordWriter::new();
    writer.push(frame_bytes);
    let mut bytes = writer.finish(60);
    bytes[0] = version;
    let crc = crc32fast::hash(&bytes[..9]);
    bytes[9..LOG_HEADER_LEN].copy_from_slice(&crc.to_be_bytes());
    let mut frames = decode_log_record(&keys::log(40), &bytes)
        .expect("framing intact")
        .frames;
    assert_eq!(frames.len(), 1);
    frames.pop().expect("one frame")
}

#[test]
fn s2_a_frame_without_its_identity_is_completed_from_the_previous_head() {
    let frame = frame_with_events(3);
    let identity = HeadIdentity::of(&frame.head);
    let with = encode_frame(&frame, true, &[]);
    let without = encode_frame(&frame, false, &[]);
    assert!(
        without.len() + 100 < with.len(),
        "{} vs {}",
        without.len(),
        with.len()
    );
    assert_eq!(
        decode_one(LOG_FORMAT_VERSION, &with).complete(None),
        Some(frame.clone())
    );
    let stored = decode_one(LOG_FORMAT_VERSION, &without);
    assert_eq!(stored.events, frame.events);
    assert_eq!(
        stored.clone().complete(None),
        None,
        "no identity to complete it with"
    );
    let other = HeadIdentity::of(&frame_with_events(1).head);
    assert_eq!(
        stored.clone().complete(Some(other)),
        None,
        "another execution's"
    );
    assert_eq!(stored.complete(Some(identity)), Some(frame));
}

/// A frame with fixed ids, so its version 1 bytes can be a fixture.
fn fixed_frame() -> Frame {
    use crate::ids::{MessageId, RevisionId, TurnId};
    let mut frame = frame_with_events(2);
    let id = ExecutionId::from_bytes([1; 16]);
    let head = &mut frame.head;
    head.execution_id = id;
    head.session_id = SessionId::from_bytes([2; 16]);
    head.run_id = RunId::from_bytes([3; 16]);
    head.revision_id = RevisionId::from_bytes([4; 16]);
    head.turn_id = TurnId::from_bytes([5; 16]);
    head.user_message_id = MessageId::from_bytes([6; 16]);
    head.reply_message_id = MessageId::from_bytes([7; 16]);
    for event in &mut frame.events {
        event.execution_id = id;
    }
    frame
}

/// `fixed_frame()` as formats 1–3 were recorded: its last activity not set (those formats
/// wrote it in every frame, as they found it).
fn recorded_frame() -> Frame {
    let mut frame = fixed_frame();
    frame.head.last_activity_ms = 0;
    frame
}

/// `recorded_frame()` as log format 1 wrote it (`bincode(Frame)` with its frame header),
/// recorded from the format 1 encoder (commit 4ac7142's `encode_frame`).
const V1_FIXTURE_HEX: &str = concat!(
    "000001315fdc50d6010101010101010101010101010101010101010101010101010101010101010102020202",
    "0202020202020202020202020303030303030303030303030303030300000000000404040404040404040404",
    "0404040404050505050505050505050505050505050606060606060606060606060606060607070707070707",
    "0707070707070707070000000001040000000000000073746570030000000000000006000000000000000000",
    "0000000000000000000000000000000000020000000000000001010101010101010101010101010101050000",
    "00000000002800000000000000a40600000000000002000000000000000a0000000500000000000000010101",
    "0101010101010101010101010106000000000000002900000000000000a40600000000000002000000000000",
    "000a00000006000000000000000000000000000000",
);

/// `recorded_frame()` as log format 2 wrote it, with and without the head's identity,
/// recorded from the format 2 encoder (commit 5724873's `encode_frame`).
const V2_FIXTURE_HEX: &str = concat!(
    "000000fa0a712d0d010101010101010101010101010101010101010101010101010101010101010101020202",
    "0202020202020202020202020203030303030303030303030303030303000000000004040404040404040404",
    "0404040404040505050505050505050505050505050506060606060606060606060606060606070707070707",
    "0707070707070707070700000000010400000000000000737465700300000000000000060000000000000000",
    "00000000000000000000000000000000000005000000000000002800000000000000a4060000000000000200",
    "00000000000002000000000000000a00000005000000000000000a0000000600000000000000000000000000",
    "00000000000000000000",
);
const V2_FIXTURE_WITHOUT_IDENTITY_HEX: &str = concat!(
    "000000850a6d9002010101010101010101010101010101010000000000010400000000000000737465700300",
    "0000000000000600000000000000000000000000000000000000000000000000000500000000000000280000",
    "0000000000a406000000000000020000000000000002000000000000000a00000005000000000000000a0000",
    "00060000000000000000000000000000000000000000000000",
);

fn from_hex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&hex[at..at + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn s6_a_version_2_log_record_still_decodes() {
    let frame = recorded_frame();
    let identity = HeadIdentity::of(&frame.head);
    let with = decode_one(LOG_FORMAT_V2, &from_hex(V2_FIXTURE_HEX));
    assert_eq!(with.complete(None), Some(frame.clone()));
    let without = decode_one(LOG_FORMAT_V2, &from_hex(V2_FIXTURE_WITHOUT_IDENTITY_HEX));
    assert_eq!(without.complete(Some(identity)), Some(frame));
}

#[test]
fn s6_a_version_3_log_record_still_decodes() {
    let frame = recorded_frame();
    let with = decode_one(LOG_FORMAT_V3, &from_hex(V3_FIXTURE_HEX));
    assert_eq!(with.complete(None), Some(frame.clone()));
    let without = decode_one(LOG_FORMAT_V3, &from_hex(V3_FIXTURE_WITHOUT_IDENTITY_HEX));
    // A format 3 frame carries its own attempt: the previous head's is not taken.
    let mut previous = HeadIdentity::of(&frame.head);
    previous.attempt = Some(crate::records::AttemptLease {
        attempt_id: crate::ids::AttemptId::new(),
        owner_id: crate::ids::OwnerId::new(),
        epoch: 9,
    });
    assert_eq!(without.complete(Some(previous)), Some(frame));
}

#[test]
fn s6_format_4_writes_the_same_frame_in_fewer_bytes_and_reads_it_back() {
    let frame = fixed_frame();
    for (with_identity, v3_hex) in [
        (true, V3_FIXTURE_HEX),
        (false, V3_FIXTURE_WITHOUT_IDENTITY_HEX),
    ] {
        let v4 = encode_frame(&frame, with_identity, &[]);
        let v3_len = v3_hex.len() / 2;
        assert!(v4.len() < v3_len, "{} bytes, format 3 {v3_len}", v4.len());
        let stored = decode_one(LOG_FORMAT_VERSION, &v4);
        let identity = (!with_identity).then(|| HeadIdentity::of(&frame.head));
        assert_eq!(stored.complete(identity), Some(frame.clone()));
        // Read as format 3, the same bytes are not that frame: the version byte decides.
        match decode_one_frame(LOG_FORMAT_V3, &v4) {
            DecodedFrame::Corrupt { claimed } => assert_eq!(claimed, frame.head.execution_id),
            DecodedFrame::Ok(misread) => {
                assert_ne!(misread.complete(identity), Some(frame.clone()))
            }
        }
    }
    // Numbers of every varint width, as real clocks and long histories give them.
    let mut large = fixed_frame();
    large.head.last_activity_ms = 1_764_000_000_000;
    large.head.fencing_epoch = u64::MAX;
    large.head.version = u64::from(u32::MAX) + 1;
    for event in &mut large.events {
        event.at_ms = 1_764_000_000_000;
        event.writer_epoch = u64::MAX;
    }
    let stored = decode_one(LOG_FORMAT_VERSION, &encode_frame(&large, true, &[]));
    assert_eq!(stored.complete(None), Some(large));
}

#[test]
fn s6_format_4_carries_the_attempt_only_with_the_identity() {
    let mut frame = fixed_frame();
    frame.head.attempt = Some(crate::records::AttemptLease {
        attempt_id: crate::ids::AttemptId::from_bytes([8; 16]),
        owner_id: crate::ids::OwnerId::from_bytes([9; 16]),
        epoch: 2,
    });
    let with = encode_frame(&frame, true, &[]);
    let without = encode_frame(&frame, false, &[]);
    let bare = encode_frame(&fixed_frame(), false, &[]);
    assert_eq!(
        without.len(),
        bare.len(),
        "no attempt in a frame without identity"
    );
    assert_eq!(
        decode_one(LOG_FORMAT_VERSION, &with).complete(None),
        Some(frame.clone())
    );
    // Without the identity, the attempt is the previous head's.
    let stored = decode_one(LOG_FORMAT_VERSION, &without);
    let previous = HeadIdentity::of(&frame.head);
    assert_eq!(stored.clone().complete(Some(previous)), Some(frame.clone()));
    let before = HeadIdentity::of(&fixed_frame().head);
    let completed = stored.complete(Some(before)).expect("same execution");
    assert_eq!(
        completed.head.attempt, None,
        "the attempt the head had before"
    );
}

#[test]
fn s6_a_version_1_log_record_still_decodes() {
    let stored = decode_one(LOG_FORMAT_V1, &from_hex(V1_FIXTURE_HEX));
    assert_eq!(stored.complete(None), Some(recorded_frame()));
}

/// `recorded_frame()` as log format 3 wrote it, with and without the head's identity,
/// recorded from the format 3 encoder (commit 56106e9's `encode_frame`).
const V3_FIXTURE_HEX: &str = concat!(
    "0000008eeb022625010101010101010101010101010101010101010101010101010101010101010101020202",
    "0202020202020202020202020203030303030303030303030303030303000004040404040404040404040404",
    "0404040505050505050505050505050505050506060606060606060606060606060606070707070707070707",
    "0707070707070700010473746570030600000000000528fba40602020a050a060000",
);
const V3_FIXTURE_WITHOUT_IDENTITY_HEX: &str = concat!(
    "0000001cf8d66787010101010101010101010101010101010000010473746570030600000000000528fba406",
    "02020a050a060000",
);
