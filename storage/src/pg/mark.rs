//! S-7 on PostgreSQL (N-4): each node keeps, beside its own data, the highest log position
//! it saw acknowledged in the database — the file `acknowledged-<database id>`, in the
//! sled store's format (`acknowledged.rs`). A node that opens a database holding less (one
//! restored from an older dump, which keeps the database's id) refuses to serve, unless it
//! accepts the loss: then it reports the gap, moves the numbering past what it acknowledged
//! (a position it answered never names another event) and its mark down to what is there.
//!
//! The mark is the database's highest position at the node's open, then each group this
//! node commits. A thread writes it every `EVERY` when it moved, and once more when the store
//! closes: a node killed outright loses at most that much of its mark (the database keeps
//! the history itself), where the sled store's mark trails nothing it acknowledged.
//!
//! A database with another id is another database: its mark starts from what it holds.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::Client;

use super::schema::{self, Present};
use crate::acknowledged::{self, Acknowledged};
use crate::error::{Error, Result};
use crate::ids::ExecutionId;
use crate::open::SalvageReport;

/// How often the writer writes the mark when it moved.
const EVERY: Duration = Duration::from_millis(100);

/// The mark's file for the database `database_id`, in the node's directory `dir`.
pub(super) fn path(dir: &Path, database_id: uuid::Uuid) -> PathBuf {
    dir.join(format!("acknowledged-{database_id}"))
}

/// Checks the database against the node's mark in `dir` (refusing one that lost what the
/// node acknowledged, unless `salvaging`), and opens the mark at what the database holds.
/// `quarantined` goes into a salvage's report.
pub(super) fn open(
    client: &mut Client,
    dir: &Path,
    salvaging: bool,
    quarantined: Vec<(ExecutionId, String)>,
) -> Result<(Acknowledged, Option<SalvageReport>)> {
    std::fs::create_dir_all(dir).map_err(|error| Error::io(dir, error))?;
    let present = schema::present(client)?;
    let path = path(dir, present.database_id);
    let (acknowledged_through, unreadable) = match Acknowledged::read(&path) {
        Err(Error::AcknowledgedUnreadable { .. }) if salvaging => (None, true),
        read => (read?, false),
    };
    if acknowledged_through.is_none() && !unreadable {
        warn_of_other_databases(dir, &path);
    }
    let lost = acknowledged::check(acknowledged_through, present.through, salvaging)?;
    if let Some(lost) = lost {
        schema::number_past(client, lost)?;
    }
    let mark = Acknowledged::open(&path, present.through)?;
    let report =
        (lost.is_some() || unreadable).then(|| report(present, acknowledged_through, quarantined));
    if let Some(report) = &report {
        tracing::warn!(
            ?report,
            "the database lost history this node acknowledged; serving what remains"
        );
    }
    Ok((mark, report))
}

/// What a salvage names: the gap. The executions that lost history cannot be named from
/// what remains (a dump holds none of what came after it).
fn report(
    present: Present,
    acknowledged_through: Option<u64>,
    quarantined: Vec<(ExecutionId, String)>,
) -> SalvageReport {
    SalvageReport {
        acknowledged_through,
        present_through: present.through,
        lost_positions: acknowledged_through
            .map_or(0, |acked| acked.saturating_sub(present.through)),
        lost_executions: Vec::new(),
        quarantined,
    }
}

/// A node's first open of this database, in a directory that served others: said, not
/// refused (pointing a node at a new database is an operator's choice).
fn warn_of_other_databases(dir: &Path, path: &Path) {
    let others: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("acknowledged-") && !name.ends_with(".new"))
        .collect();
    if !others.is_empty() {
        tracing::warn!(
            mark = %path.display(),
            ?others,
            "this node served other databases before; this one has no mark yet and starts from what it holds"
        );
    }
}

/// The thread that writes the mark as this node's groups commit.
#[derive(Debug)]
pub(super) struct Writer {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Writes `committed` (raised by the committers) to `mark` whenever it moved.
    pub fn start(mut mark: Acknowledged, committed: Arc<AtomicU64>) -> Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("openprogram-pg-mark".into())
            .spawn(move || loop {
                let last = matches!(
                    stopped.recv_timeout(EVERY),
                    Err(RecvTimeoutError::Disconnected)
                );
                let position = committed.load(Ordering::Relaxed);
                if position > mark.position() {
                    if let Err(error) = mark.write(position) {
                        tracing::error!(%error, "writing this node's acknowledged mark");
                    }
                }
                if last {
                    return;
                }
            })
            .map_err(|error| Error::Database(format!("starting the mark's writer: {error}")))?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Writer {
    /// Writes the mark once more and stops (call after the committers stopped).
    fn drop(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the mark's writer panicked");
            }
        }
    }
}
