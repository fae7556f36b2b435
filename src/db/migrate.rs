//! The embedded migrations, applied through diesel-async's harness (no libpq).
//!
//! One `migrate` run at a time: a session advisory lock, taken by polling
//! `pg_try_advisory_lock` (a run *waiting* inside `pg_advisory_lock` holds
//! a snapshot, and `CREATE INDEX CONCURRENTLY` waits for every older
//! snapshot: the two would deadlock). Migrations run one by one; those
//! that run outside a transaction (`metadata.toml`: the concurrent index
//! builds on crm's `bookings` and on the audit trail) run without the
//! session's statement and lock timeouts, after dropping an `INVALID` index
//! an interrupted build of theirs left behind.

use std::time::Duration;

use diesel::{
    QueryableByName,
    sql_types::{BigInt, Bool, Text},
};
use diesel_async::{AsyncMigrationHarness, AsyncPgConnection, RunQueryDsl};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use super::DbError;
use crate::config::DatabaseSettings;

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Serialises concurrent `migrate` runs of several instances.
pub const MIGRATION_LOCK_KEY: i64 = 0x626b_6578_7069_7265; // "bkexpire"

/// How often a run waiting for another one asks for the lock again.
const LOCK_POLL: Duration = Duration::from_millis(200);

/// One migration that builds one index with `CREATE INDEX CONCURRENTLY`
/// (outside a transaction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrentBuild {
    pub version: &'static str,
    pub table: &'static str,
    pub index: &'static str,
}

const fn build(version: &'static str, table: &'static str, index: &'static str) -> ConcurrentBuild {
    ConcurrentBuild {
        version,
        table,
        index,
    }
}

/// The migrations that build one index with `CREATE INDEX CONCURRENTLY`
/// (outside a transaction): the worker's partial indexes on crm's
/// `bookings`, and the replay's indexes on its own audit trail, which every
/// expiry writes to. An interrupted build leaves the index `INVALID` and
/// its migration unrecorded; the next run drops it before building again.
pub const CONCURRENT_INDEX_BUILDS: [ConcurrentBuild; 5] = [
    build(
        "20261204000001",
        "bookings",
        "ix_bookings_reserve_expires_at",
    ),
    build(
        "20261204000002",
        "bookings",
        "ix_bookings_booking_expires_at",
    ),
    build(
        "20261205000001",
        "booking_expiration_audit",
        "ix_booking_expiration_audit_id",
    ),
    build(
        "20261205000002",
        "booking_expiration_audit",
        "ix_booking_expiration_audit_tenant_id_id",
    ),
    build(
        "20261205000003",
        "booking_expiration_audit",
        "ix_booking_expiration_audit_at_id",
    ),
];

/// Applies pending migrations; returns the versions applied (empty when
/// the schema was current). Needs the multi-thread runtime and a session
/// of its own (the advisory lock and the session settings belong to it).
pub async fn run_migrations(settings: &DatabaseSettings) -> Result<Vec<String>, DbError> {
    let mut conn = super::establish(settings).await?;
    lock(&mut conn).await?;
    let (mut conn, applied) = apply_pending(conn).await;
    let unlocked = diesel::sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<BigInt, _>(MIGRATION_LOCK_KEY)
        .execute(&mut conn)
        .await
        .map(drop)
        .map_err(DbError::from);
    outcome(applied, unlocked)
}

/// Takes the migration lock, waiting (idle, without a snapshot) while
/// another run holds it.
async fn lock(conn: &mut AsyncPgConnection) -> Result<(), DbError> {
    #[derive(QueryableByName)]
    struct Locked {
        #[diesel(sql_type = Bool)]
        locked: bool,
    }
    let mut announced = false;
    loop {
        let Locked { locked } = diesel::sql_query("SELECT pg_try_advisory_lock($1) AS locked")
            .bind::<BigInt, _>(MIGRATION_LOCK_KEY)
            .get_result(conn)
            .await?;
        if locked {
            return Ok(());
        }
        if !announced {
            tracing::info!("another migrate run holds the migration lock; waiting for it to end");
            announced = true;
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
}

/// Runs the pending migrations in order, each on its own: the connection
/// comes back whatever happened, for the unlock.
async fn apply_pending(
    conn: AsyncPgConnection,
) -> (AsyncPgConnection, Result<Vec<String>, DbError>) {
    let mut harness = AsyncMigrationHarness::new(conn);
    let pending = match pending_in(&mut harness) {
        Ok(pending) => pending,
        Err(e) => return (harness.into_inner(), Err(e)),
    };
    let mut applied = Vec::with_capacity(pending.len());
    for (version, in_transaction) in pending {
        let mut conn = harness.into_inner();
        let saved = if in_transaction {
            None
        } else {
            match prepare_concurrent(&mut conn, &version).await {
                Ok(saved) => Some(saved),
                Err(e) => return (conn, Err(e)),
            }
        };
        harness = AsyncMigrationHarness::new(conn);
        let ran = run_one(&mut harness, &version);
        let mut conn = harness.into_inner();
        // A failed migration ends the run (and the session): its error is
        // the one to report, the timeouts need no restoring.
        if let Err(e) = ran {
            return (conn, Err(e));
        }
        if let Some(saved) = saved
            && let Err(e) = restore_timeouts(&mut conn, &saved).await
        {
            return (conn, Err(e));
        }
        tracing::info!(version = %version, concurrent = !in_transaction, "migration applied");
        applied.push(version);
        harness = AsyncMigrationHarness::new(conn);
    }
    (harness.into_inner(), Ok(applied))
}

type Harness = AsyncMigrationHarness<AsyncPgConnection>;

/// The pending migrations, oldest first: version and whether it runs in a
/// transaction (the migrations themselves are not `Send`, so they stay in
/// these synchronous helpers).
fn pending_in(harness: &mut Harness) -> Result<Vec<(String, bool)>, DbError> {
    let pending = harness
        .pending_migrations(MIGRATIONS)
        .map_err(|e| DbError::Migration(e.to_string()))?;
    Ok(pending
        .iter()
        .map(|m| {
            (
                m.name().version().to_string(),
                m.metadata().run_in_transaction(),
            )
        })
        .collect())
}

/// Applies the embedded migration `version` and records it.
fn run_one(harness: &mut Harness, version: &str) -> Result<(), DbError> {
    let migrations = diesel::migration::MigrationSource::<diesel::pg::Pg>::migrations(&MIGRATIONS)
        .map_err(|e| DbError::Migration(e.to_string()))?;
    let migration = migrations
        .iter()
        .find(|m| m.name().version().to_string() == version)
        .ok_or_else(|| DbError::Migration(format!("{version}: not embedded")))?;
    harness
        .run_migration(&**migration)
        .map(drop)
        .map_err(|e| DbError::Migration(format!("{version}: {e}")))
}

/// The session's timeouts, as `current_setting` shows them.
#[derive(QueryableByName)]
struct Timeouts {
    #[diesel(sql_type = Text)]
    statement_timeout: String,
    #[diesel(sql_type = Text)]
    lock_timeout: String,
}

/// Before a migration that runs outside a transaction: lifts the session's
/// statement and lock timeouts (a concurrent build blocks no write, and
/// waiting for older transactions is part of it: a timeout would only
/// leave an `INVALID` index on a large or busy table) and drops the
/// `INVALID` index an interrupted build of this migration left. Returns the
/// timeouts to restore.
async fn prepare_concurrent(
    conn: &mut AsyncPgConnection,
    version: &str,
) -> Result<Timeouts, DbError> {
    let saved: Timeouts = diesel::sql_query(
        "SELECT current_setting('statement_timeout') AS statement_timeout, \
                current_setting('lock_timeout') AS lock_timeout",
    )
    .get_result(conn)
    .await?;
    diesel::sql_query(
        "SELECT set_config('statement_timeout', '0', false), set_config('lock_timeout', '0', false)",
    )
    .execute(conn)
    .await?;
    if let Some(build) = CONCURRENT_INDEX_BUILDS
        .iter()
        .find(|b| b.version == version)
    {
        drop_invalid_index(conn, build.table, build.index).await?;
    }
    Ok(saved)
}

async fn restore_timeouts(conn: &mut AsyncPgConnection, saved: &Timeouts) -> Result<(), DbError> {
    diesel::sql_query(
        "SELECT set_config('statement_timeout', $1, false), set_config('lock_timeout', $2, false)",
    )
    .bind::<Text, _>(&saved.statement_timeout)
    .bind::<Text, _>(&saved.lock_timeout)
    .execute(conn)
    .await?;
    Ok(())
}

/// Drops index `name` on `table` if it is `INVALID` (`pg_index.indisvalid`
/// false: a concurrent build that did not finish), CONCURRENTLY. A valid
/// index, or none, is left alone.
async fn drop_invalid_index(
    conn: &mut AsyncPgConnection,
    table: &str,
    name: &str,
) -> Result<(), DbError> {
    #[derive(QueryableByName)]
    struct Invalid {
        #[diesel(sql_type = Text)]
        qualified: String,
    }
    let invalid: Option<Invalid> = diesel::sql_query(
        "SELECT format('%I.%I', n.nspname, c.relname) AS qualified \
           FROM pg_index i \
           JOIN pg_class c ON c.oid = i.indexrelid \
           JOIN pg_namespace n ON n.oid = c.relnamespace \
          WHERE i.indrelid = to_regclass($1) AND c.relname = $2 AND NOT i.indisvalid",
    )
    .bind::<Text, _>(table)
    .bind::<Text, _>(name)
    .get_result(conn)
    .await
    .map(Some)
    .or_else(|e| match e {
        diesel::result::Error::NotFound => Ok(None),
        e => Err(e),
    })?;
    if let Some(Invalid { qualified }) = invalid {
        tracing::warn!(
            index = %qualified,
            "dropping the INVALID index an interrupted concurrent build left; it is built again"
        );
        // The name comes from the catalog, quoted by format('%I').
        diesel::sql_query(format!("DROP INDEX CONCURRENTLY IF EXISTS {qualified}"))
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// The embedded migrations the database has not applied, oldest first.
/// Reads `__diesel_schema_migrations` only (a database without it has
/// applied none), so a deploy pipeline can ask without changing anything.
pub async fn pending_migrations(settings: &DatabaseSettings) -> Result<Vec<String>, DbError> {
    #[derive(QueryableByName)]
    struct Version {
        #[diesel(sql_type = Text)]
        version: String,
    }
    #[derive(QueryableByName)]
    struct Present {
        #[diesel(sql_type = Bool)]
        present: bool,
    }
    let mut conn = super::establish(settings).await?;
    let table: Present = diesel::sql_query(
        "SELECT to_regclass('__diesel_schema_migrations') IS NOT NULL AS present",
    )
    .get_result(&mut conn)
    .await?;
    let applied: Vec<Version> = if table.present {
        diesel::sql_query("SELECT version FROM __diesel_schema_migrations")
            .load(&mut conn)
            .await?
    } else {
        Vec::new()
    };
    let applied: std::collections::HashSet<String> =
        applied.into_iter().map(|v| v.version).collect();
    let embedded = diesel::migration::MigrationSource::<diesel::pg::Pg>::migrations(&MIGRATIONS)
        .map_err(|e| DbError::Migration(e.to_string()))?;
    let mut pending: Vec<String> = embedded
        .iter()
        .map(|m| m.name().version().to_string())
        .filter(|version| !applied.contains(version))
        .collect();
    pending.sort();
    Ok(pending)
}

/// What a run reports: the migrations' own result, whatever the unlock
/// did. A failed unlock is only logged: the advisory lock belongs to the
/// session, which ends when the connection is dropped right after.
fn outcome<T>(applied: Result<T, DbError>, unlocked: Result<(), DbError>) -> Result<T, DbError> {
    if let Err(error) = unlocked {
        tracing::warn!(
            error = %error,
            "cannot release the migration lock; it is released when the session ends"
        );
    }
    applied
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{db::bookings, domain::Phase};

    /// Each embedded migration: version, in a transaction or not, up.sql.
    fn embedded() -> Vec<(String, bool, String)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let migrations =
            diesel::migration::MigrationSource::<diesel::pg::Pg>::migrations(&MIGRATIONS)
                .expect("embedded migrations");
        migrations
            .iter()
            .map(|m| {
                let name = m.name().to_string();
                let up = std::fs::read_to_string(root.join(&name).join("up.sql"))
                    .unwrap_or_else(|e| panic!("{name}/up.sql: {e}"));
                (
                    m.name().version().to_string(),
                    m.metadata().run_in_transaction(),
                    up,
                )
            })
            .collect()
    }

    /// The SQL without `--` comments, statements split on `;`.
    fn statements(sql: &str) -> Vec<String> {
        let code: String = sql
            .lines()
            .map(|line| line.split("--").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        code.split(';')
            .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|s| !s.is_empty())
            .collect()
    }

    #[test]
    fn every_migration_outside_a_transaction_is_one_listed_concurrent_build() {
        let outside: Vec<_> = embedded().into_iter().filter(|(_, tx, _)| !tx).collect();
        assert_eq!(
            outside
                .iter()
                .map(|(v, _, _)| v.as_str())
                .collect::<Vec<_>>(),
            CONCURRENT_INDEX_BUILDS.map(|b| b.version),
            "the migrations run outside a transaction are exactly the listed builds"
        );
        for ((version, _, up), build) in outside.iter().zip(CONCURRENT_INDEX_BUILDS) {
            let statements = statements(up);
            assert_eq!(
                statements.len(),
                1,
                "{version}: one statement: {statements:?}"
            );
            assert!(
                statements[0].starts_with(&format!(
                    "CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON {} ",
                    build.index, build.table
                )),
                "{version}: {}",
                statements[0]
            );
        }
    }

    #[test]
    fn the_concurrent_builds_are_the_repository_partial_indexes() {
        let mut listed: Vec<&str> = CONCURRENT_INDEX_BUILDS
            .iter()
            .filter(|b| b.table == "bookings")
            .map(|b| b.index)
            .collect();
        let mut repository: Vec<&str> = Phase::ALL
            .iter()
            .map(|p| bookings::partial_index(*p))
            .collect();
        listed.sort_unstable();
        repository.sort_unstable();
        assert_eq!(listed, repository);
    }

    #[test]
    fn no_migration_in_a_transaction_builds_an_index_on_bookings() {
        for (version, in_transaction, up) in embedded() {
            if in_transaction {
                for statement in statements(&up) {
                    let upper = statement.to_uppercase();
                    assert!(
                        !(upper.starts_with("CREATE INDEX") && upper.contains(" ON BOOKINGS ")),
                        "{version} builds an index on crm's table in a transaction: {statement}"
                    );
                }
            }
        }
    }

    fn unlock_failure() -> Result<(), DbError> {
        Err(DbError::Query(
            diesel::result::Error::BrokenTransactionManager,
        ))
    }

    #[test]
    fn a_failed_unlock_keeps_the_migration_error() {
        let result = outcome::<Vec<String>>(
            Err(DbError::Migration("syntax error in up.sql".into())),
            unlock_failure(),
        );
        assert!(
            matches!(&result, Err(DbError::Migration(m)) if m == "syntax error in up.sql"),
            "{result:?}"
        );
    }

    #[test]
    fn a_failed_unlock_keeps_the_applied_versions() {
        let result = outcome(Ok(vec!["2026-12-01-000001".to_owned()]), unlock_failure());
        assert_eq!(result.ok(), Some(vec!["2026-12-01-000001".to_owned()]));
    }

    #[test]
    fn a_successful_unlock_changes_nothing() {
        assert!(matches!(
            outcome::<()>(Err(DbError::Migration("x".into())), Ok(())),
            Err(DbError::Migration(_))
        ));
        assert_eq!(outcome(Ok(3), Ok(())).ok(), Some(3));
    }
}
