//! Typed identifiers of SPEC §3: newtypes over `uuid::Uuid`, never bare strings.
//!
//! Each id prints with a fixed prefix (`ex_0190…`) so a log line or a URL says what it names.
//! Parsing accepts the prefixed form and, for ids that clients generate themselves (a
//! `command_id` is a client UUID in the HTTP contract), the bare UUID form.
//! Encoding: its 16 UUID bytes in binary formats (bincode), its prefixed string in
//! human-readable ones (JSON). How ids are keyed on disk is `keys.rs`'s.

use std::fmt;
use std::str::FromStr;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

/// Why a string is not an id of the expected kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a valid {kind} (expected `{prefix}_` followed by a UUID)")]
pub struct ParseIdError {
    pub kind: &'static str,
    pub prefix: &'static str,
    pub input: String,
}

/// Room for an id's printed form: a prefix of at most 15 bytes, `_`, 32 hex digits.
const PRINTED_BYTES_MAX: usize = 48;

/// An id's printed form, written into `buffer`: what `Display` prints, and what JSON
/// serializes as one string (not `collect_str`, which escapes each piece separately).
fn printed<'b>(
    prefix: &str,
    uuid: &Uuid,
    buffer: &'b mut [u8; PRINTED_BYTES_MAX],
) -> Result<&'b str, std::str::Utf8Error> {
    let separator = prefix.len();
    let (head, hex) = buffer.split_at_mut(separator + 1);
    head[..separator].copy_from_slice(prefix.as_bytes());
    head[separator] = b'_';
    let length = separator + 1 + uuid.simple().encode_lower(hex).len();
    std::str::from_utf8(&buffer[..length])
}

macro_rules! define_id {
    ($($(#[$doc:meta])* $name:ident, $prefix:literal;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Uuid);

        // `printed` writes the prefix, `_` and 32 hex digits into PRINTED_BYTES_MAX bytes.
        const _: () = assert!($prefix.len() + 33 <= PRINTED_BYTES_MAX);

        impl $name {
            /// The prefix of this id's printed form, without the underscore.
            pub const PREFIX: &'static str = $prefix;

            /// A fresh id. UUID v7: ids made later sort later, which keeps keys that start
            /// with them close together on disk.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            pub const fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            pub const fn from_bytes(bytes: [u8; 16]) -> Self {
                Self(Uuid::from_bytes(bytes))
            }

            pub const fn as_uuid(&self) -> &Uuid {
                &self.0
            }

            pub const fn as_bytes(&self) -> &[u8; 16] {
                self.0.as_bytes()
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut buffer = [0; PRINTED_BYTES_MAX];
                f.write_str(printed($prefix, &self.0, &mut buffer).map_err(|_| fmt::Error)?)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;

            fn from_str(input: &str) -> Result<Self, Self::Err> {
                let raw = input
                    .strip_prefix(concat!($prefix, "_"))
                    .unwrap_or(input);
                Uuid::parse_str(raw).map(Self).map_err(|_| ParseIdError {
                    kind: stringify!($name),
                    prefix: $prefix,
                    input: input.chars().take(80).collect(),
                })
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                if serializer.is_human_readable() {
                    let mut buffer = [0; PRINTED_BYTES_MAX];
                    let printed = printed($prefix, &self.0, &mut buffer)
                        .map_err(serde::ser::Error::custom)?;
                    serializer.serialize_str(printed)
                } else {
                    self.0.as_bytes().serialize(serializer)
                }
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                if deserializer.is_human_readable() {
                    let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                    text.parse().map_err(de::Error::custom)
                } else {
                    <[u8; 16]>::deserialize(deserializer).map(Self::from_bytes)
                }
            }
        }
    )*};
}

define_id! {
    /// A conversation: the scope of authorization. Never a control target.
    SessionId, "ses";
    /// Groups an original execution with its forks and retries.
    RunId, "run";
    /// Names one execution for its whole life, across restarts and attempts; the exact
    /// target of a control. For Jobs, the job id is the execution id.
    ExecutionId, "ex";
    /// One activation of an execution by an owner.
    AttemptId, "att";
    /// An immutable version of the program and its contract (provider, tools, function code).
    RevisionId, "rev";
    /// De-duplicates commands: the same id with the same payload returns the stored outcome.
    CommandId, "cmd";
    /// The user message an execution answers; stable across resume.
    TurnId, "turn";
    /// A message of the conversation graph (the user message or the assistant reply).
    MessageId, "msg";
    /// An approval, question, form or permission request.
    WaitId, "wait";
    /// One model request or tool call; the key of its receipt.
    EffectId, "eff";
    /// A managed process. Never the OS pid.
    ProcessId, "proc";
    /// One runtime incarnation: a new one at every start of the process.
    OwnerId, "own";
    /// J-1: one lease of resources held by a Job's attempt, from its grant to its release.
    LeaseId, "lease";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_has_prefix_and_round_trips() {
        let id = ExecutionId::new();
        let text = id.to_string();
        assert!(text.starts_with("ex_"), "{text}");
        assert_eq!(text.parse::<ExecutionId>(), Ok(id));
    }

    #[test]
    fn bare_uuid_parses_and_wrong_prefix_does_not() {
        let uuid = Uuid::new_v4();
        assert_eq!(
            uuid.to_string().parse::<CommandId>(),
            Ok(CommandId::from_uuid(uuid))
        );
        let err = format!("run_{}", uuid.simple())
            .parse::<ExecutionId>()
            .unwrap_err();
        assert_eq!(err.kind, "ExecutionId");
        assert!("ex_not-a-uuid".parse::<ExecutionId>().is_err());
    }

    /// JSON (the HTTP API, next actions) carries an id as its printed form, as `Display`
    /// prints it, for every id type; and reads it back.
    #[test]
    fn json_is_the_printed_form_for_every_id_type() {
        fn check<Id>(id: Id)
        where
            Id: Serialize + for<'de> Deserialize<'de> + fmt::Display + PartialEq + fmt::Debug,
        {
            let json = serde_json::to_string(&id).expect("ids serialize");
            assert_eq!(json, format!("\"{id}\""));
            assert_eq!(
                serde_json::from_str::<Id>(&json).expect("ids read back"),
                id
            );
        }
        let uuid = Uuid::new_v4();
        check(SessionId::from_uuid(uuid));
        check(RunId::from_uuid(uuid));
        check(ExecutionId::from_uuid(uuid));
        check(AttemptId::from_uuid(uuid));
        check(RevisionId::from_uuid(uuid));
        check(CommandId::from_uuid(uuid));
        check(TurnId::from_uuid(uuid));
        check(MessageId::from_uuid(uuid));
        check(WaitId::from_uuid(uuid));
        check(EffectId::from_uuid(uuid));
        check(ProcessId::from_uuid(uuid));
        check(OwnerId::from_uuid(uuid));
        check(EffectId::from_uuid(Uuid::max()));
        assert_eq!(
            serde_json::to_string(&EffectId::from_uuid(Uuid::nil())).expect("ids serialize"),
            "\"eff_00000000000000000000000000000000\""
        );
    }

    #[test]
    fn binary_encoding_is_sixteen_bytes() {
        let id = SessionId::new();
        let bytes = bincode::serialize(&id).expect("ids always serialize");
        assert_eq!(bytes.len(), 16);
        assert_eq!(bincode::deserialize::<SessionId>(&bytes).ok(), Some(id));
    }
}
