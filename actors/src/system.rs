//! The actix system of one runtime: its own thread running the system, and one arbiter per
//! core for execution actors. The embedder's tokio runtime never runs actors; it talks to
//! them through `Addr`s, whose futures work from any executor.

use std::thread::JoinHandle;

use actix::prelude::*;

use crate::error::{Error, Result};

/// Arbiters for execution actors: one per core of the target machine.
pub const ARBITERS: usize = 2;

#[derive(Debug)]
pub struct ActorSystem {
    system: System,
    arbiters: Vec<ArbiterHandle>,
    thread: Option<JoinHandle<()>>,
}

impl ActorSystem {
    pub fn start(name: &str) -> Result<Self> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("{name}-actors"))
            .spawn(move || {
                let runner = System::new();
                let arbiters: Vec<Arbiter> = (0..ARBITERS).map(|_| Arbiter::new()).collect();
                let handles = arbiters.iter().map(Arbiter::handle).collect::<Vec<_>>();
                if ready_tx.send((System::current(), handles)).is_err() {
                    return;
                }
                if let Err(error) = runner.run() {
                    tracing::error!(%error, "the actor system stopped with an error");
                }
                for arbiter in arbiters {
                    arbiter.stop();
                    let _ = arbiter.join();
                }
            })
            .map_err(|error| {
                Error::Unavailable(format!("cannot start the actor thread: {error}"))
            })?;
        let (system, arbiters) = ready_rx
            .recv()
            .map_err(|_| Error::Unavailable("the actor thread died while starting".into()))?;
        Ok(Self {
            system,
            arbiters,
            thread: Some(thread),
        })
    }

    pub fn arbiters(&self) -> Vec<ArbiterHandle> {
        self.arbiters.clone()
    }

    /// Stops every arbiter and the system, and waits for the thread.
    pub fn stop(&mut self) {
        self.system.stop();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the actor thread panicked");
            }
        }
    }
}

impl Drop for ActorSystem {
    fn drop(&mut self) {
        self.stop();
    }
}
