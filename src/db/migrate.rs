//! The embedded migrations, applied through diesel-async's harness (no libpq).

use diesel_async::{AsyncMigrationHarness, RunQueryDsl};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use super::DbError;
use crate::config::DatabaseSettings;

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Serialises concurrent `migrate` runs of several instances.
pub const MIGRATION_LOCK_KEY: i64 = 0x626b_6578_7069_7265; // "bkexpire"

/// Applies pending migrations; returns the versions applied (empty when
/// the schema was current). Needs the multi-thread runtime.
pub async fn run_migrations(settings: &DatabaseSettings) -> Result<Vec<String>, DbError> {
    let mut conn = super::establish(settings).await?;
    diesel::sql_query("SELECT pg_advisory_lock($1)")
        .bind::<diesel::sql_types::BigInt, _>(MIGRATION_LOCK_KEY)
        .execute(&mut conn)
        .await?;
    let mut harness = AsyncMigrationHarness::new(conn);
    let applied = harness
        .run_pending_migrations(MIGRATIONS)
        .map(|versions| versions.iter().map(ToString::to_string).collect())
        .map_err(|e| DbError::Migration(e.to_string()));
    let mut conn = harness.into_inner();
    let unlocked = diesel::sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<diesel::sql_types::BigInt, _>(MIGRATION_LOCK_KEY)
        .execute(&mut conn)
        .await
        .map(drop)
        .map_err(DbError::from);
    outcome(applied, unlocked)
}

/// The embedded migrations the database has not applied, oldest first.
/// Reads `__diesel_schema_migrations` only (a database without it has
/// applied none), so a deploy pipeline can ask without changing anything.
pub async fn pending_migrations(settings: &DatabaseSettings) -> Result<Vec<String>, DbError> {
    #[derive(diesel::QueryableByName)]
    struct Version {
        #[diesel(sql_type = diesel::sql_types::Text)]
        version: String,
    }
    #[derive(diesel::QueryableByName)]
    struct Present {
        #[diesel(sql_type = diesel::sql_types::Bool)]
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
