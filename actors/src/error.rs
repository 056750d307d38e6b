//! The errors of the actor layer, each with a stable code for transports.

use openprogram_storage::CommandRecord;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Unknown id, or an id of another session (X-1: indistinguishable).
    #[error("not found")]
    NotFound,
    /// S-8: the execution was purged (retention, or its session deleted): gone for good.
    #[error("execution {0} was purged")]
    Purged(openprogram_storage::ExecutionId),
    /// S-8: a session is purged only once all its executions ended.
    #[error("{0} executions of the session have not ended")]
    ActiveExecutions(usize),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// a request field the runtime does not know (`field`), refused before anything
    /// is stored.
    #[error("unknown field: {message}")]
    UnknownField { field: String, message: String },
    /// a kind the contract names that this build does not run yet.
    #[error("unsupported kind: {0}")]
    UnsupportedKind(String),
    /// W-6: an answer that does not fit its wait's request; `field` names the item. Nothing
    /// is recorded.
    #[error("invalid answer: {message}")]
    InvalidAnswer { field: String, message: String },
    /// C-2: another turn holds the session (`foreground`), and the message asked to be
    /// refused then, or could not steer it. Nothing is stored.
    #[error("the session is busy with {foreground}: {message}")]
    SessionBusy {
        foreground: openprogram_storage::ExecutionId,
        message: String,
    },
    /// A kind the contract does not name.
    #[error("unknown kind: {0}")]
    UnknownKind(String),
    /// F-1: no function of this name is registered.
    #[error("unknown function `{0}`")]
    UnknownFunction(String),
    /// F-1: a function's input that does not decode as the function's input.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// J-1: a Job asks for a resource the runtime does not declare.
    #[error("unknown resource `{0}`")]
    UnknownResource(String),
    /// J-1: a Job asks for more of a resource than its whole capacity: it could never run.
    #[error("{resource}: {amount} asked, the capacity is {capacity}")]
    ExceedsCapacity {
        resource: String,
        amount: u32,
        capacity: u32,
    },
    /// The command id was used before with another payload or execution (K-4).
    #[error("command id {} was used with another payload", stored.command_id)]
    CommandConflict { stored: Box<CommandRecord> },
    /// The attempt was fenced by a newer one.
    #[error("the attempt was fenced by epoch {current_epoch}")]
    Fenced { current_epoch: u64 },
    #[error("the execution moved on to version {current}")]
    VersionConflict { current: u64 },
    #[error(transparent)]
    Storage(#[from] openprogram_storage::Error),
    /// The runtime was built without the hook this needs (`compactor`).
    #[error("no {0} is configured")]
    HookMissing(&'static str),
    /// The embedder's hook (`compactor`, `namer`) failed; nothing was written.
    #[error("the {hook} failed: {message}")]
    HookFailed { hook: &'static str, message: String },
    /// The actor system is stopping or stopped.
    #[error("the runtime is not running: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub fn code(&self) -> &'static str {
        match self {
            Error::NotFound => "not_found",
            Error::Purged(_) => "purged",
            Error::ActiveExecutions(_) => "active_executions",
            Error::InvalidRequest(_) => "invalid_request",
            Error::UnknownField { .. } => "unknown_field",
            Error::UnsupportedKind(_) => "unsupported_kind",
            Error::UnknownKind(_) => "unknown_kind",
            Error::InvalidAnswer { .. } => "invalid_answer",
            Error::SessionBusy { .. } => "session_busy",
            Error::UnknownFunction(_) => "unknown_function",
            Error::InvalidInput(_) => "invalid_input",
            Error::UnknownResource(_) => "unknown_resource",
            Error::ExceedsCapacity { .. } => "exceeds_capacity",
            Error::CommandConflict { .. } => "command_conflict",
            Error::Fenced { .. } => "fenced",
            Error::VersionConflict { .. } => "version_conflict",
            Error::Storage(error) => error.code(),
            Error::HookMissing(_) => "hook_missing",
            Error::HookFailed { .. } => "hook_failed",
            Error::Unavailable(_) => "unavailable",
            Error::Internal(_) => "internal",
        }
    }
}
