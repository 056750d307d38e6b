//! The errors of the storage layer. Business outcomes of a transition (a version conflict, a
//! fenced writer, a duplicate command) are not errors: they are `Outcome`s (`transition.rs`).

use std::path::{Path, PathBuf};

use crate::ids::ExecutionId;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// sled reported an error. Kept as text so the error stays `Clone` for every waiter of a
    /// failed group.
    #[error("storage engine error: {0}")]
    Sled(String),
    /// The database (the PostgreSQL store) refused a statement or could not be reached.
    /// Kept as text, like `Sled`.
    #[error("database error: {0}")]
    Database(String),
    /// N-2: several runtime nodes need a store they share (PostgreSQL); sled is one
    /// process's.
    #[error("several nodes need a shared store (postgres://…); this one is {0}")]
    SingleNode(&'static str),
    /// N-2: a later incarnation of this node id took its place in the registry: this one
    /// must stop writing.
    #[error("node {0} was taken over by a later incarnation")]
    NodeSuperseded(String),
    #[error("i/o error on {path}: {message}")]
    Io { path: PathBuf, message: String },
    /// Another process (or another handle in this one) holds the store.
    #[error("the store at {path} is already open in another process or handle")]
    Locked { path: PathBuf },
    /// A record failed its checksum or could not be decoded (S-4).
    #[error("corrupted record in {tree} at key {key}")]
    Corrupted { tree: &'static str, key: String },
    /// The execution has a corrupted record and takes no more reads or writes (S-4).
    #[error("execution {execution_id} is quarantined: {reason}")]
    Quarantined {
        execution_id: ExecutionId,
        reason: String,
    },
    /// A payload exceeds a configured limit (S-5).
    #[error("{what} of {len} bytes exceeds the limit of {max} bytes")]
    PayloadTooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
    /// S-8: the execution was purged (retention, or its session deleted).
    #[error("execution {0} was purged")]
    Purged(ExecutionId),
    /// A transition names an execution that does not exist and does not create it.
    #[error("execution {0} does not exist")]
    UnknownExecution(ExecutionId),
    /// A transition is malformed: a programming error of the caller, refused before commit.
    #[error("invalid transition: {0}")]
    InvalidTransition(String),
    /// A `Limits` value the store cannot work with (a bound of zero).
    #[error("invalid store limits: {0}")]
    InvalidLimits(String),
    /// The store's schema is newer than this build knows.
    #[error("store schema version {found} is newer than the supported version {supported}")]
    UnsupportedSchema { found: u32, supported: u32 },
    /// A flush or fsync failed earlier; the store acknowledges nothing more until reopened.
    #[error("the store stopped accepting writes after a failed write: {0}")]
    FailStop(String),
    /// The store was closed.
    #[error("the store is closed")]
    Closed,
    /// S-7: the store's log ends before a position it acknowledged: a damaged or truncated
    /// file lost acknowledged history, or a database was restored from an older dump (N-4).
    /// Nothing is served; `--accept-loss` salvages.
    #[error(
        "the store lost acknowledged history: log positions {}..={acknowledged_through} were \
         acknowledged but the store ends at {present_through} (a damaged or truncated file, or \
         a database restored from an older dump?). \
         Nothing was served. To keep what remains, open it with --accept-loss (`accept_loss`), \
         which reports what was lost before serving",
        present_through + 1
    )]
    AcknowledgedLost {
        acknowledged_through: u64,
        present_through: u64,
    },
    /// S-7: the file recording what the store acknowledged is damaged.
    #[error(
        "the record of what the store acknowledged ({path}) is damaged: the store cannot tell \
         whether it lost history. Open it with --accept-loss to salvage"
    )]
    AcknowledgedUnreadable { path: PathBuf },
}

impl Error {
    /// `Io`: `error` of an operation on `path`.
    pub(crate) fn io(path: &Path, error: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            message: error.to_string(),
        }
    }

    /// `Corrupted`: the record at `key`, named by its tree (`keys::tree_name`).
    pub(crate) fn corrupted(key: &[u8]) -> Self {
        Error::Corrupted {
            tree: crate::keys::tree_name(key),
            key: crate::keys::display(key),
        }
    }

    /// A stable, machine-readable code for transports (`{"code": ..}`).
    pub fn code(&self) -> &'static str {
        match self {
            Error::Sled(_) | Error::Io { .. } => "storage_io",
            Error::Database(_) => "database",
            Error::SingleNode(_) => "single_node_store",
            Error::NodeSuperseded(_) => "node_superseded",
            Error::Locked { .. } => "store_locked",
            Error::Corrupted { .. } => "corrupted",
            Error::Quarantined { .. } => "quarantined",
            Error::PayloadTooLarge { .. } => "payload_too_large",
            Error::Purged(_) => "purged",
            Error::UnknownExecution(_) => "not_found",
            Error::InvalidTransition(_) => "invalid_transition",
            Error::InvalidLimits(_) => "invalid_limits",
            Error::UnsupportedSchema { .. } => "unsupported_schema",
            Error::FailStop(_) => "fail_stop",
            Error::Closed => "closed",
            Error::AcknowledgedLost { .. } => "acknowledged_lost",
            Error::AcknowledgedUnreadable { .. } => "acknowledged_unreadable",
        }
    }
}

impl From<sled::Error> for Error {
    fn from(error: sled::Error) -> Self {
        Error::Sled(error.to_string())
    }
}
