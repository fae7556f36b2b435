//! The embedded migrations, applied through diesel-async's harness (no libpq).

use diesel_async::{AsyncMigrationHarness, RunQueryDsl};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use super::DbError;
use crate::config::DatabaseSettings;

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Serialises concurrent `migrate` runs of several instances.
const MIGRATION_LOCK_KEY: i64 = 0x626b_6578_7069_7265; // "bkexpire"

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
    diesel::sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<diesel::sql_types::BigInt, _>(MIGRATION_LOCK_KEY)
        .execute(&mut conn)
        .await?;
    applied
}
