//! Mailbox depths (I-3). actix keeps the length of an actor's mailbox to itself, so the
//! runtime counts it: an actor is addressed through a `Mailbox`, and every message sent
//! through one carries a `Waiting` token that counts it until its handler takes it, or
//! until it is dropped unhandled (the actor stopped, the caller gave up on its answer).
//! The count is exact for what goes through `Mailbox` and `Counted`; the debug endpoint
//! shows it as `mailbox_len`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::dev::{MessageResponse, OneshotSender, RecipientRequest, Request, ToEnvelope};
use actix::prelude::*;

/// How many messages sent to one actor wait for their handler.
#[derive(Debug, Clone, Default)]
pub struct Depth(Arc<AtomicU64>);

impl Depth {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn token(&self) -> Waiting {
        self.0.fetch_add(1, Ordering::Relaxed);
        Waiting(Arc::clone(&self.0))
    }

    /// `message`, counted until its handler takes it.
    pub fn counted<M>(&self, message: M) -> Counted<M> {
        Counted {
            message,
            _waiting: self.token(),
        }
    }
}

/// One message counted in its actor's `Depth`; uncounted when dropped.
#[derive(Debug)]
struct Waiting(Arc<AtomicU64>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A message on its way to an actor, counted while it waits.
#[derive(Debug)]
pub struct Counted<M> {
    message: M,
    _waiting: Waiting,
}

impl<M: Message> Message for Counted<M> {
    type Result = M::Result;
}

impl<M> Counted<M> {
    /// The message, no longer counted: its handler has it.
    pub fn take(self) -> M {
        self.message
    }
}

/// The answer of a counted message's handler: the message's own.
#[derive(Debug)]
pub struct Handled<R>(pub R);

impl<A, M, R> MessageResponse<A, Counted<M>> for Handled<R>
where
    A: Actor,
    M: Message,
    R: MessageResponse<A, M>,
{
    fn handle(self, ctx: &mut A::Context, tx: Option<OneshotSender<M::Result>>) {
        self.0.handle(ctx, tx);
    }
}

/// Lets `$actor` take `Counted<M>` for every `M` it handles.
macro_rules! counted_mailbox {
    ($actor:ty) => {
        impl<M> actix::Handler<$crate::mailbox::Counted<M>> for $actor
        where
            Self: actix::Handler<M>,
            M: actix::Message,
        {
            type Result = $crate::mailbox::Handled<<Self as actix::Handler<M>>::Result>;

            fn handle(
                &mut self,
                counted: $crate::mailbox::Counted<M>,
                ctx: &mut Self::Context,
            ) -> Self::Result {
                $crate::mailbox::Handled(<Self as actix::Handler<M>>::handle(
                    self,
                    counted.take(),
                    ctx,
                ))
            }
        }
    };
}
pub(crate) use counted_mailbox;

/// An actor's address with the count of what waits in its mailbox.
#[derive(Debug)]
pub struct Mailbox<A: Actor> {
    addr: Addr<A>,
    depth: Depth,
}

impl<A: Actor> Clone for Mailbox<A> {
    fn clone(&self) -> Self {
        Self {
            addr: self.addr.clone(),
            depth: self.depth.clone(),
        }
    }
}

impl<A: Actor> Mailbox<A> {
    /// The address `addr` of an actor whose mailbox `depth` counts.
    pub fn new(addr: Addr<A>, depth: Depth) -> Self {
        Self { addr, depth }
    }

    /// Starts, on the current arbiter, the actor `make` builds with its mailbox's depth.
    pub fn start_with(make: impl FnOnce(Depth) -> A) -> Self
    where
        A: Actor<Context = Context<A>>,
    {
        let depth = Depth::default();
        Self::new(make(depth.clone()).start(), depth)
    }

    /// `start_with` on `arbiter`.
    pub fn start_in(arbiter: &ArbiterHandle, make: impl FnOnce(Depth) -> A + Send + 'static) -> Self
    where
        A: Actor<Context = Context<A>>,
    {
        let depth = Depth::default();
        let counted = depth.clone();
        Self::new(A::start_in_arbiter(arbiter, move |_| make(counted)), depth)
    }

    /// Messages sent and not yet handled.
    pub fn waiting(&self) -> u64 {
        self.depth.get()
    }

    pub fn depth(&self) -> &Depth {
        &self.depth
    }

    pub fn connected(&self) -> bool {
        self.addr.connected()
    }

    /// Sends `message` and resolves to its answer, as `Addr::send`.
    pub fn send<M>(&self, message: M) -> Request<A, Counted<M>>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<Counted<M>>,
        A::Context: ToEnvelope<A, Counted<M>>,
    {
        self.addr.send(self.depth.counted(message))
    }

    /// Sends `message`, its answer unread, as `Addr::do_send`.
    pub fn do_send<M>(&self, message: M)
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<Counted<M>>,
        A::Context: ToEnvelope<A, Counted<M>>,
    {
        self.addr.do_send(self.depth.counted(message));
    }

    /// Where `M` can be sent without naming the actor.
    pub fn recipient<M>(&self) -> CountedRecipient<M>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<Counted<M>>,
        A::Context: ToEnvelope<A, Counted<M>>,
    {
        CountedRecipient {
            recipient: self.addr.clone().recipient(),
            depth: self.depth.clone(),
        }
    }
}

/// A `Recipient` whose messages are counted in their actor's mailbox.
pub struct CountedRecipient<M>
where
    M: Message + Send,
    M::Result: Send,
{
    recipient: Recipient<Counted<M>>,
    depth: Depth,
}

impl<M> Clone for CountedRecipient<M>
where
    M: Message + Send,
    M::Result: Send,
{
    fn clone(&self) -> Self {
        Self {
            recipient: self.recipient.clone(),
            depth: self.depth.clone(),
        }
    }
}

impl<M> std::fmt::Debug for CountedRecipient<M>
where
    M: Message + Send,
    M::Result: Send,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountedRecipient")
            .field("waiting", &self.depth.get())
            .finish()
    }
}

impl<M> CountedRecipient<M>
where
    M: Message + Send,
    M::Result: Send,
{
    pub fn send(&self, message: M) -> RecipientRequest<Counted<M>> {
        self.recipient.send(self.depth.counted(message))
    }

    pub fn do_send(&self, message: M) {
        self.recipient.do_send(self.depth.counted(message));
    }

    pub fn connected(&self) -> bool {
        self.recipient.connected()
    }
}
