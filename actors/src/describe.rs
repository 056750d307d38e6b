//! What a live actor says about itself, for the debug endpoint (I-3): the same shape for
//! every kind, with the messages waiting in its mailbox (counted by `mailbox::Depth`).

use actix::prelude::*;

/// One actor's own account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorSummary {
    pub kind: &'static str,
    pub id: String,
    /// The name of the arbiter thread it runs on.
    pub arbiter: String,
    /// Messages it has handled.
    pub handled: u64,
    /// Messages sent to it that wait for their handler.
    pub mailbox_len: u64,
    pub state: String,
}

/// Asks an actor for its `ActorSummary`.
#[derive(Debug, Message)]
#[rtype(result = "ActorSummary")]
pub struct Describe;

/// The name of the thread running now (an arbiter's, inside a handler).
pub fn arbiter_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .to_owned()
}
