//! N-1: the store a `RuntimeBuilder` names — a caller's, a PostgreSQL URL's (feature
//! `postgres`), or sled's directory — opened for the runtime's actors and readers.

use std::path::PathBuf;
use std::sync::Arc;

use openprogram_storage::{EventReader, EventStore, Limits, Store};

use crate::{Error, Result, RuntimeBuilder};

/// A store as the actors write it and the readers read it.
type Handles = (Arc<dyn EventStore>, Arc<dyn EventReader>);

impl RuntimeBuilder {
    /// The store the builder names: a caller's, a PostgreSQL URL's, or sled's directory.
    pub(crate) fn open_store(
        &mut self,
    ) -> Result<(Handles, Option<openprogram_storage::SalvageReport>)> {
        if let Some(store) = self.store.take() {
            return Ok((store, None));
        }
        let data_dir = match self.store_url.take() {
            Some(url) if is_postgres_url(&url) => {
                let node = self.data_dir.take().map(|dir| (dir, self.accept_loss));
                return open_postgres(&url, &self.limits, node);
            }
            Some(directory) => PathBuf::from(directory),
            None => self.data_dir.take().ok_or_else(|| {
                Error::InvalidRequest("the runtime needs a data_dir or a store".into())
            })?,
        };
        let (store, salvage) = match self.accept_loss {
            true => Store::open_salvaging(&data_dir, self.limits.clone())?,
            false => (Store::open_with(&data_dir, self.limits.clone())?, None),
        };
        Ok(((Arc::new(store.clone()), Arc::new(store)), salvage))
    }
}

/// Whether `serve --store` (and `RuntimeBuilder::store_url`) names a PostgreSQL database.
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// A node's data directory and whether it accepts a database that lost history it
/// acknowledged (S-7, N-4).
type Node = Option<(PathBuf, bool)>;

#[cfg(feature = "postgres")]
fn open_postgres(
    url: &str,
    limits: &Limits,
    node: Node,
) -> Result<(Handles, Option<openprogram_storage::SalvageReport>)> {
    use openprogram_storage::pg::PgStore;
    let (store, salvage) = match node {
        Some((dir, accept_loss)) => PgStore::open_node(url, limits.clone(), &dir, accept_loss)?,
        None => (PgStore::open_with(url, limits.clone())?, None),
    };
    Ok(((Arc::new(store.clone()), Arc::new(store)), salvage))
}

#[cfg(not(feature = "postgres"))]
fn open_postgres(
    _url: &str,
    _limits: &Limits,
    _node: Node,
) -> Result<(Handles, Option<openprogram_storage::SalvageReport>)> {
    Err(Error::InvalidRequest(
        "this build has no PostgreSQL store: enable the feature `postgres`".into(),
    ))
}
