//! The two backends the conformance suites run on (`conformance.rs`,
//! `conformance_sessions.rs`): sled always, PostgreSQL where it is installed, and the
//! `suite!` macro that runs each test once per backend.

use openprogram_storage::{EventStore, PgStore, Store};

use crate::support::eager_limits;

/// A store to test, opened again on the same data by each `open`.
pub(crate) trait Backend: Sync {
    fn open(&self) -> Box<dyn EventStore>;
}

pub(crate) struct Sled(tempfile::TempDir);

impl Sled {
    pub(crate) fn new() -> Self {
        Self(tempfile::tempdir().expect("tempdir"))
    }
}

impl Backend for Sled {
    fn open(&self) -> Box<dyn EventStore> {
        Box::new(Store::open_with(self.0.path(), eager_limits()).expect("open sled"))
    }
}

pub(crate) struct Postgres(String);

impl Postgres {
    pub(crate) fn new() -> Self {
        Self(crate::pg_cluster::database())
    }
}

impl Backend for Postgres {
    fn open(&self) -> Box<dyn EventStore> {
        Box::new(PgStore::open(&self.0).expect("open PostgreSQL"))
    }
}

/// Each test, once per backend.
#[macro_export]
macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod sled {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(&$crate::conformance_backends::Sled::new()).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
                            `cargo test --workspace -- --include-ignored`"]
                async fn $name() {
                    super::$name(&$crate::conformance_backends::Postgres::new()).await
                }
            )*
        }
    };
}
