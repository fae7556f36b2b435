//! PostgreSQL access: the pool, the embedded migrations and the two
//! repositories. All SQL of the worker lives under this module; every value
//! reaches SQL as a bound parameter.
//!
//! Every unit of work runs in an explicit transaction, reads included, and
//! the pool checks connections with the simple protocol: through a pooler
//! in transaction mode (`DATABASE_POOLER=transaction`) a server connection
//! is ours only inside a transaction, and a statement prepared outside one
//! could be run on another server connection than the one that prepared it.

pub mod bookings;
mod connect;
pub mod migrate;
pub mod outbox;
mod pool;
pub mod privileges;
pub mod replay;
pub mod seed;
pub mod tls;
pub mod waker;

pub use pool::{PgPool, PooledConnection, build_pool, connect_pool, establish, ping, probe};

use std::time::Duration;

/// A statement's one `count` column (`… AS count`).
#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    count: i64,
}

/// Errors of the persistence layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    #[error("cannot connect to PostgreSQL at DATABASE_URL")]
    Connect(#[source] diesel::ConnectionError),
    /// The session connection past the pooler (LISTEN, `migrate`).
    #[error("cannot connect to PostgreSQL at DATABASE_DIRECT_URL")]
    ConnectDirect(#[source] diesel::ConnectionError),
    #[error("no PostgreSQL connection within {0:?} (DATABASE_URL)")]
    ConnectTimeout(Duration),
    #[error("no pooled PostgreSQL connection: {0}")]
    Pool(String),
    /// A statement failed; a grant missing at run time (revoked after the
    /// start check, SQLSTATE 42501) is said to be one.
    #[error("statement failed{}", privileges::hint(.0))]
    Query(#[from] diesel::result::Error),
    #[error("migration failed: {0}")]
    Migration(String),
    #[error("cannot encode a value for PostgreSQL: {0}")]
    Encode(String),
    /// A grant the role needs is missing ([`privileges::check`]).
    #[error(transparent)]
    MissingGrant(#[from] privileges::MissingGrant),
}

impl From<bb8::RunError<diesel_async::pooled_connection::PoolError>> for DbError {
    fn from(error: bb8::RunError<diesel_async::pooled_connection::PoolError>) -> Self {
        match error {
            bb8::RunError::User(diesel_async::pooled_connection::PoolError::ConnectionError(e)) => {
                DbError::Connect(e)
            }
            bb8::RunError::User(diesel_async::pooled_connection::PoolError::QueryError(e)) => {
                DbError::Query(e)
            }
            bb8::RunError::TimedOut => DbError::Pool("timed out waiting for a connection".into()),
        }
    }
}
