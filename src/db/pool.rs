//! The bb8 pool of diesel-async connections, with per-session limits so a
//! stuck statement or an abandoned transaction cannot hold row locks for long.

use std::time::Duration;

use diesel::ConnectionError;
use diesel_async::{
    AsyncPgConnection, SimpleAsyncConnection,
    pooled_connection::{AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod},
};
use futures_util::FutureExt;

use super::DbError;
use crate::{
    config::{DatabaseSettings, Pooler},
    libpq::DatabaseUrl,
};

pub type PgPool = bb8::Pool<AsyncDieselConnectionManager<AsyncPgConnection>>;
pub type PooledConnection<'a> =
    bb8::PooledConnection<'a, AsyncDieselConnectionManager<AsyncPgConnection>>;

/// Session settings applied to every new connection; none through a
/// transaction pooler, where a `SET` would stay on a server connection that
/// other clients (crm) get next, and would not follow this client to the
/// next one: there the limits belong on the role (docs/configuration.md,
/// "Behind a connection pooler").
fn session_setup_sql(settings: &DatabaseSettings) -> String {
    if !settings.pooler.keeps_sessions() {
        return String::new();
    }
    let millis = |limit: Duration| limit.as_millis().max(1);
    let statement_ms = millis(settings.statement_timeout);
    // Locks are taken with SKIP LOCKED and never waited for; the lock
    // timeout only bounds DDL-style surprises. An idle transaction (a
    // process frozen mid-batch) is ended by the server so its row locks
    // return to the other instances.
    // The URL's application_name (or PGAPPNAME) when given, as libpq
    // would send it; the worker's own name otherwise.
    let name = settings
        .url
        .config()
        .get_application_name()
        .unwrap_or(DEFAULT_APPLICATION_NAME)
        .replace('\'', "''");
    format!(
        "SET application_name = '{name}'; \
         SET statement_timeout = {statement_ms}; \
         SET lock_timeout = {statement_ms}; \
         SET idle_in_transaction_session_timeout = {idle_ms}; \
         SET TIME ZONE 'UTC';",
        idle_ms = millis(settings.idle_in_transaction_timeout()),
    )
}

/// `application_name` when neither the URL nor `PGAPPNAME` gives one.
const DEFAULT_APPLICATION_NAME: &str = "booking-expiration";

/// The checkout check with `target_session_attrs=read-write`: fails on a
/// session that can no longer write.
const READ_WRITE_CHECK: &str = "DO $$ BEGIN \
     IF current_setting('transaction_read_only') = 'on' THEN \
       RAISE EXCEPTION 'the server no longer accepts writes (target_session_attrs=read-write)'; \
     END IF; END $$";

/// Connects as `DATABASE_URL` says (TLS per its libpq parameters, several
/// hosts and `target_session_attrs` as libpq, see [`super::tls`]) and
/// applies the session settings.
///
/// Through a transaction pooler the statement cache is off (see
/// [`super::tls`]): diesel-async prepares each statement under a name
/// (`s0`, `s1`, … counted per process) in one exchange and runs and closes
/// it in later ones. Outside a transaction the pooler may send those to
/// different server connections, leaving a name behind where another
/// process's statement of that name collides (`prepared statement "s8"
/// already exists`). Every unit of work here is a transaction (see
/// [`super`]), so all of a statement's exchanges reach one server
/// connection, and uncached, nothing outlives the transaction.
async fn establish_with(
    url: &DatabaseUrl,
    pooler: Pooler,
    setup_sql: &str,
) -> Result<AsyncPgConnection, ConnectionError> {
    let mut conn = super::connect::connect(url, pooler).await?;
    if !setup_sql.is_empty() {
        conn.batch_execute(setup_sql)
            .await
            .map_err(|e| ConnectionError::BadConnection(e.to_string()))?;
    }
    Ok(conn)
}

/// One connection outside the pool (migrations, LISTEN), with the same
/// session settings and a connect timeout.
pub async fn establish(settings: &DatabaseSettings) -> Result<AsyncPgConnection, DbError> {
    let setup = session_setup_sql(settings);
    tokio::time::timeout(
        settings.connect_timeout,
        establish_with(&settings.url, settings.pooler, &setup),
    )
    .await
    .map_err(|_| DbError::ConnectTimeout(settings.connect_timeout))?
    .map_err(|error| {
        if settings.is_direct {
            DbError::ConnectDirect(error)
        } else {
            DbError::Connect(error)
        }
    })
}

/// Opens and closes one connection: a wrong URL, password or host is
/// reported with the server's own reason instead of a pool timeout.
pub async fn probe(settings: &DatabaseSettings) -> Result<(), DbError> {
    drop(establish(settings).await?);
    Ok(())
}

/// Probes, then builds the pool.
pub async fn connect_pool(settings: &DatabaseSettings) -> Result<PgPool, DbError> {
    probe(settings).await?;
    Ok(build_pool(settings))
}

/// Builds the pool without connecting; connections open on first use.
pub fn build_pool(settings: &DatabaseSettings) -> PgPool {
    let setup = session_setup_sql(settings);
    let mut config = ManagerConfig::<AsyncPgConnection>::default();
    let url = settings.url.clone();
    let pooler = settings.pooler;
    // The manager's URL string is not used: each new connection is made
    // from the parsed URL, its TLS configuration built (and its
    // certificate files read) again.
    config.custom_setup = Box::new(move |_| {
        let url = url.clone();
        let setup = setup.clone();
        async move { establish_with(&url, pooler, &setup).await }.boxed()
    });
    // Checked at every checkout with the simple protocol: no prepared
    // statement (which a transaction pooler could split across server
    // connections). A connection whose server died fails here, and so does,
    // with target_session_attrs=read-write, one whose server stopped taking
    // writes (demoted, or fenced read-only); it is replaced by a new one,
    // which goes to whichever host is writable now.
    let check = if settings.url.wants_read_write() {
        READ_WRITE_CHECK
    } else {
        "SELECT 1"
    };
    config.recycling_method =
        RecyclingMethod::CustomFunction(Box::new(move |conn| conn.batch_execute(check).boxed()));
    // Unused (see `custom_setup`): the redacted URL, so that no Debug of
    // the pool can show the password.
    let manager = AsyncDieselConnectionManager::new_with_config(settings.url.redacted(), config);
    bb8::Pool::builder()
        .max_size(settings.pool_size)
        .connection_timeout(settings.connect_timeout)
        .build_unchecked(manager)
}

/// How long the readiness probe waits for the database.
const DB_PING_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether a pooled connection answers `SELECT 1` within two seconds (the
/// readiness probe). The simple protocol: no prepared statement, which a
/// transaction pooler could not keep between two messages.
pub async fn ping(pool: &PgPool) -> bool {
    use diesel_async::SimpleAsyncConnection;
    let ping = async {
        let mut conn = pool.get().await.ok()?;
        conn.batch_execute("SELECT 1").await.ok()
    };
    matches!(
        tokio::time::timeout(DB_PING_TIMEOUT, ping).await,
        Ok(Some(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::catalog::DATABASE_STATEMENT_TIMEOUT, libpq::DatabaseUrl};

    /// The issue's `SET` failure: PostgreSQL takes its timeouts as int
    /// milliseconds, and the idle limit is twice the statement timeout. At
    /// the range's ceiling both still fit.
    #[test]
    fn the_session_limits_fit_postgres_int_milliseconds_across_the_range() {
        let url = DatabaseUrl::parse("postgres://u@h/db").expect("a URL");
        let range = DATABASE_STATEMENT_TIMEOUT.range().expect("a range");
        for statement_timeout in [range.min, range.max] {
            let settings = DatabaseSettings {
                statement_timeout,
                ..DatabaseSettings::new(url.clone())
            };
            let sql = session_setup_sql(&settings);
            let limits: Vec<u64> = sql
                .split(';')
                .filter_map(|part| part.split(" = ").nth(1)?.trim().parse().ok())
                .collect();
            assert_eq!(limits.len(), 3, "{sql}");
            for ms in limits {
                assert!(ms <= i32::MAX as u64, "{sql}");
            }
        }
    }
}
