//! I-3: a mailbox counts what waits in it until its handler takes it, or until it is
//! dropped unhandled.

use actix::prelude::*;

use crate::mailbox::{counted_mailbox, Mailbox};
use futures::channel::oneshot;

/// Holds its mailbox shut while a `Hold` is in its handler.
struct Gate;

impl Actor for Gate {
    type Context = Context<Self>;
}

counted_mailbox!(Gate);

#[derive(Message)]
#[rtype(result = "()")]
struct Hold(oneshot::Receiver<()>);

impl Handler<Hold> for Gate {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, Hold(open): Hold, _ctx: &mut Context<Self>) -> Self::Result {
        AtomicResponse::new(Box::pin(fut::wrap_future(async move {
            let _ = open.await;
        })))
    }
}

#[derive(Message)]
#[rtype(result = "u64")]
struct Ping(u64);

impl Handler<Ping> for Gate {
    type Result = u64;

    fn handle(&mut self, Ping(n): Ping, _ctx: &mut Context<Self>) -> u64 {
        n
    }
}

#[actix::test]
async fn i3_a_mailbox_counts_what_waits_until_its_handler_takes_it() {
    let gate = Mailbox::start_with(|_| Gate);
    let (open, held) = oneshot::channel();
    let holding = gate.send(Hold(held));
    // Taken by its handler once the actor runs: no longer waiting.
    for n in 0..3 {
        gate.do_send(Ping(n));
    }
    let answered = gate.send(Ping(3));
    assert_eq!(gate.waiting(), 5, "the hold and four pings were sent");
    tokio::task::yield_now().await;
    assert_eq!(
        gate.waiting(),
        4,
        "the hold is in its handler; four pings wait"
    );
    open.send(()).expect("the hold waits");
    holding.await.expect("answered");
    assert_eq!(answered.await.expect("answered"), 3);
    assert_eq!(gate.waiting(), 0);
}

#[actix::test]
async fn i3_messages_dropped_unhandled_leave_the_count() {
    let gate = Mailbox::start_with(|_| Gate);
    let (open, held) = oneshot::channel::<()>();
    gate.do_send(Hold(held));
    tokio::task::yield_now().await;
    // A caller that gives up on its answer: the message is dropped when its turn comes.
    drop(gate.send(Ping(1)));
    gate.do_send(Ping(2));
    assert_eq!(gate.waiting(), 2);
    drop(open);
    let probe = gate.send(Ping(3));
    assert_eq!(probe.await.expect("answered"), 3);
    assert_eq!(gate.waiting(), 0, "handled or dropped, none still counted");
}
