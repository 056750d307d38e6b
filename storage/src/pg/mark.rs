//! S-7 on PostgreSQL (N-4): each node keeps, beside its own data, the highest log position
//! it saw acknowledged in the database — the file `acknowledged-<database id>`, in the
//! sled store's format (`acknowledged.rs`). A node that opens a database holding less (one
//! restored from an older dump, which keeps the database's id) refuses to serve, unless it
//! accepts the loss.
//!
//! The first node to accept a loss retires the database's identity (`op_retired_identities`,
//! with what the database held) and gives it a new one, and moves the numbering `MARGIN`
//! past everything it knew: a position any node answered before the restore never names
//! another event. Every other node finds its mark under the retired identity: it refuses in
//! turn if its mark is beyond what the database held then, else it goes on under the new one.
//!
//! The mark is the database's highest position at the node's open, then each group this
//! node commits. A thread writes it every `EVERY` when it moved, and once more when the store
//! closes: a node killed outright (or exiting on a lost lease) may leave the last `EVERY` of its acknowledgements out of
//! its mark, and a restore that lost only those goes unnoticed by it (the sled store's mark
//! trails nothing it acknowledged).
//!
//! A database this node never served, under any identity, is another database: its mark
//! starts from what it holds. A node that served the restored database before another node
//! retired its identity, and committed after that, finds its mark beyond what was recorded
//! and refuses at its next start although it lost nothing: a refusal too many, never one
//! too few; `--accept-loss` moves it on.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::Client;
use uuid::Uuid;

use super::database;
use super::schema::{renumber, MIGRATION_LOCK, PRESENT_THROUGH};
use crate::acknowledged::{self, Acknowledged};
use crate::error::{Error, Result};
use crate::ids::ExecutionId;
use crate::open::SalvageReport;
use crate::shared::now_ms;

/// How often the writer writes the mark when it moved.
const EVERY: Duration = Duration::from_millis(100);

/// How far past what it knew a node that accepts a loss moves the numbering: 2^32
/// transactions' positions, more than any history since a dump.
const MARGIN: u64 = 1 << 48;

/// The database's identity and the highest position it holds or held.
#[derive(Debug, Clone, Copy)]
struct Present {
    database_id: Uuid,
    through: u64,
}

/// The mark's file for the database `database_id`, in the node's directory `dir`.
fn path(dir: &Path, database_id: Uuid) -> PathBuf {
    dir.join(format!("acknowledged-{database_id}"))
}

/// What a node's mark says of the database it opens.
struct Found {
    /// The position the node acknowledged last, if its mark was readable.
    acknowledged_through: Option<u64>,
    /// What the database holds of it: now, or when its identity was retired.
    present_through: u64,
    unreadable: bool,
    /// The mark's file, if the node has one for this database.
    path: Option<PathBuf>,
    /// Whether the mark names this identity (not a retired one).
    current: bool,
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
    let mut present = present(client)?;
    let found = find(client, dir, present, salvaging)?;
    let lost = acknowledged::check(found.acknowledged_through, found.present_through, salvaging)?;
    if let Some(lost) = lost {
        present = accept(client, present, lost, found.current)?;
    }
    let report = (lost.is_some() || found.unreadable).then(|| SalvageReport {
        acknowledged_through: found.acknowledged_through,
        present_through: found.present_through,
        lost_positions: lost.map_or(0, |lost| lost - found.present_through),
        lost_executions: Vec::new(),
        quarantined,
    });
    if let Some(report) = &report {
        tracing::warn!(
            ?report,
            "serving what the database holds, as told (--accept-loss)"
        );
    }
    let new = path(dir, present.database_id);
    let mark = Acknowledged::open(&new, present.through)?;
    // The mark of a retired identity goes once this one is written.
    if let Some(old) = found.path.filter(|old| *old != new) {
        std::fs::remove_file(&old).map_err(|error| Error::io(&old, error))?;
    }
    Ok((mark, report))
}

/// The node's mark for this database: under its identity, else under one it retired.
fn find(client: &mut Client, dir: &Path, present: Present, salvaging: bool) -> Result<Found> {
    let read = |path: &Path| match Acknowledged::read(path) {
        Err(Error::AcknowledgedUnreadable { .. }) if salvaging => Ok((None, true)),
        read => read.map(|mark| (mark, false)),
    };
    let current = path(dir, present.database_id);
    let (acknowledged_through, unreadable) = read(&current)?;
    if acknowledged_through.is_some() || unreadable {
        return Ok(Found {
            acknowledged_through,
            present_through: present.through,
            unreadable,
            path: Some(current),
            current: true,
        });
    }
    // A node keeps one mark per database: moving on under a new identity removes the old.
    let rows = client
        .query(
            "SELECT database_id, present_through FROM op_retired_identities \
             ORDER BY retired_at_ms DESC",
            &[],
        )
        .map_err(database)?;
    for row in rows {
        let retired = path(dir, row.get(0));
        let (acknowledged_through, unreadable) = read(&retired)?;
        if acknowledged_through.is_some() || unreadable {
            let through: i64 = row.get(1);
            return Ok(Found {
                acknowledged_through,
                present_through: u64::try_from(through).unwrap_or(0),
                unreadable,
                path: Some(retired),
                current: false,
            });
        }
    }
    warn_of_other_databases(dir);
    Ok(Found {
        acknowledged_through: None,
        present_through: present.through,
        unreadable: false,
        path: None,
        current: true,
    })
}

/// The database's `Present`.
fn present(client: &mut Client) -> Result<Present> {
    let row = client
        .query_one(
            &format!("SELECT database_id, ({PRESENT_THROUGH}) FROM op_meta WHERE id = 1"),
            &[],
        )
        .map_err(database)?;
    let through: i64 = row.get(1);
    Ok(Present {
        database_id: row.get(0),
        through: u64::try_from(through).unwrap_or(0),
    })
}

/// A node accepts the loss of what it acknowledged through `lost`. The first to find it
/// (`current`: its mark names the database's identity) retires the identity, with what the
/// database holds, for a new one, and moves the numbering `MARGIN` past both; a node whose
/// mark names a retired identity only makes sure the numbering is past its own mark. Under
/// the migration lock, in one transaction. Returns the database's `Present` then.
fn accept(client: &mut Client, present: Present, lost: u64, current: bool) -> Result<Present> {
    let mut transaction = client.transaction().map_err(database)?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(database)?;
    if !current {
        renumber(&mut transaction, lost)?;
        transaction.commit().map_err(database)?;
        return self::present(client);
    }
    // What the database holds now, under the lock: another node may have served it since
    // this one opened.
    transaction
        .execute(
            &format!(
                "INSERT INTO op_retired_identities SELECT $1, ({PRESENT_THROUGH}), $2 \
                 ON CONFLICT DO NOTHING"
            ),
            &[&present.database_id, &(now_ms() as i64)],
        )
        .map_err(database)?;
    transaction
        .execute(
            "UPDATE op_meta SET database_id = gen_random_uuid() WHERE id = 1 AND database_id = $1",
            &[&present.database_id],
        )
        .map_err(database)?;
    renumber(
        &mut transaction,
        lost.max(present.through).saturating_add(MARGIN),
    )?;
    transaction.commit().map_err(database)?;
    let renewed = self::present(client)?;
    tracing::warn!(
        retired = %present.database_id,
        database_id = %renewed.database_id,
        "the database lost history this node acknowledged; its identity was renewed"
    );
    Ok(renewed)
}

/// A node's first open of this database, in a directory that served others: said, not
/// refused (pointing a node at a new database is an operator's choice).
fn warn_of_other_databases(dir: &Path) {
    let others: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("acknowledged-") && !name.ends_with(".new"))
        .collect();
    if !others.is_empty() {
        tracing::warn!(
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
            .spawn(move || {
                let mut failing = false;
                loop {
                    let last = matches!(
                        stopped.recv_timeout(EVERY),
                        Err(RecvTimeoutError::Disconnected)
                    );
                    let position = committed.load(Ordering::Relaxed);
                    if position > mark.position() {
                        // Said once per run of failures: the node serves on, unprotected.
                        match mark.write(position) {
                            Err(error) if !failing => {
                                tracing::error!(%error, "this node cannot record what it acknowledged; a restored database would go unnoticed");
                                failing = true;
                            }
                            Err(_) => {}
                            Ok(()) => failing = false,
                        }
                    }
                    if last {
                        return;
                    }
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
