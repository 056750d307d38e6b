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
                return Ok((open_postgres(&url, &self.limits)?, None))
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

#[cfg(feature = "postgres")]
fn open_postgres(url: &str, limits: &Limits) -> Result<Handles> {
    let store = openprogram_storage::pg::PgStore::open_with(url, limits.clone())?;
    Ok((Arc::new(store.clone()), Arc::new(store)))
}

#[cfg(not(feature = "postgres"))]
fn open_postgres(_url: &str, _limits: &Limits) -> Result<Handles> {
    Err(Error::InvalidRequest(
        "this build has no PostgreSQL store: enable the feature `postgres`".into(),
    ))
}
