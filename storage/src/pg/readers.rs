//! The PostgreSQL store's reader threads: a few threads, each with a connection of its own
//! (opened at its first read, and again after it broke) and the statements prepared on it;
//! a read runs on one of them while its caller waits for the answer.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use postgres::{Client, Statement};

use super::{database, Shared};
use crate::error::{Error, Result};
use crate::shared::lock;

type Job = Box<dyn FnOnce(&mut Option<Connection>) + Send>;

/// A reader's connection and the reads prepared on it: a read given as text costs a round
/// trip to prepare (and a plan) each time, a prepared one runs in one round trip.
pub(super) struct Connection {
    client: Client,
    prepared: HashMap<String, Statement>,
}

impl Connection {
    fn new(client: Client) -> Self {
        Self {
            client,
            prepared: HashMap::new(),
        }
    }

    /// `sql` prepared on this connection, once (for the few reads every step makes).
    pub(super) fn prepared(&mut self, sql: &str) -> Result<Statement> {
        if let Some(statement) = self.prepared.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).map_err(database)?;
        self.prepared.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }
}

impl Deref for Connection {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl DerefMut for Connection {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.client
    }
}

/// The reader threads and the queue they take reads from.
#[derive(Debug)]
pub(super) struct Readers {
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Readers {
    /// `count` threads named `openprogram-pg-{name}-N`, each connecting at its first job.
    pub(super) fn start(shared: &Arc<Shared>, name: &str, count: usize) -> Result<Self> {
        let (sender, receiver) = mpsc::channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let mut threads = Vec::with_capacity(count);
        for index in 0..count {
            let receiver = Arc::clone(&receiver);
            let shared = Arc::clone(shared);
            let thread = std::thread::Builder::new()
                .name(format!("openprogram-pg-{name}-{index}"))
                .spawn(move || {
                    let mut client = None;
                    loop {
                        let job = lock(&receiver).recv();
                        let Ok(job) = job else { return };
                        if client
                            .as_ref()
                            .is_some_and(|open: &Connection| open.is_closed())
                        {
                            client = None;
                        }
                        if client.is_none() {
                            client = super::connect(&shared.url).ok().map(Connection::new);
                        }
                        job(&mut client);
                    }
                })
                .map_err(|error| Error::Database(format!("starting a {name}: {error}")))?;
            threads.push(thread);
        }
        Ok(Self {
            sender: Mutex::new(Some(sender)),
            threads: Mutex::new(threads),
        })
    }

    /// Runs `read` on a reader's connection and waits for it.
    pub(super) fn run<T: Send + 'static>(
        &self,
        read: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (reply, answer) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |client| {
            let result = match client {
                Some(client) => read(client),
                None => Err(Error::Database("no connection to the database".into())),
            };
            drop(reply.send(result));
        });
        match lock(&self.sender).as_ref() {
            Some(sender) => sender.send(job).map_err(|_| Error::Closed)?,
            None => return Err(Error::Closed),
        }
        answer.recv().map_err(|_| Error::Closed)?
    }

    /// Stops the readers once the reads queued are done.
    pub(super) fn close(&self) {
        lock(&self.sender).take();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for thread in threads {
            if thread.join().is_err() {
                tracing::error!("a PostgreSQL reader thread panicked");
            }
        }
    }
}
