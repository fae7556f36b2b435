//! `status`: the backlog per phase, the outbox's state, the poison and
//! parked rows, read in one read-only snapshot, and their text form.

use diesel_async::{AsyncConnection as _, SimpleAsyncConnection as _};

use super::AppError;
use crate::{
    clock::Clock,
    config::DatabaseSettings,
    db::{self, DbError, bookings, privileges::Use},
    domain::Phase,
};

/// What `status` reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StatusReport {
    pub as_of: chrono::DateTime<chrono::Utc>,
    pub phases: Vec<PhaseStatus>,
    pub outbox_unpublished: i64,
    pub outbox_oldest_unpublished_at: Option<chrono::DateTime<chrono::Utc>>,
    pub outbox_oldest_unpublished_age_seconds: i64,
    /// Due rows the domain refuses (first 100 per phase).
    pub poison: Vec<PoisonRow>,
    /// Outbox rows parked because the broker refused them for good.
    pub outbox_parked: i64,
    /// The first 100 parked rows, oldest first.
    pub parked: Vec<db::outbox::ParkedRow>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct PhaseStatus {
    pub phase: &'static str,
    pub backlog: i64,
    pub oldest_due_deadline: Option<chrono::DateTime<chrono::Utc>>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct PoisonRow {
    pub booking_id: uuid::Uuid,
    pub tenant_id: uuid::Uuid,
    pub phase: &'static str,
    pub status: String,
    pub deadline: Option<chrono::DateTime<chrono::Utc>>,
    pub reason: String,
}

/// `status`: reads only; takes no locks that the worker would skip. The
/// backlog is what is due at `clock`'s now.
pub async fn status(
    database: &DatabaseSettings,
    clock: &dyn Clock,
) -> Result<StatusReport, AppError> {
    let mut conn = db::establish(database).await?;
    db::privileges::check(&mut conn, &[Use::Status]).await?;
    let as_of = clock.now();
    // One read-only transaction: one snapshot, and through a transaction
    // pooler one server connection for all of it (see `db`).
    let report = conn
        .transaction(async |conn| {
            conn.batch_execute("SET TRANSACTION READ ONLY").await?;
            let mut phases = Vec::new();
            let mut poison = Vec::new();
            for phase in Phase::ALL {
                phases.push(PhaseStatus {
                    phase: phase.as_str(),
                    backlog: bookings::count_due(conn, phase, as_of).await?,
                    oldest_due_deadline: bookings::oldest_due_deadline(conn, phase, as_of).await?,
                });
                for row in bookings::due_poison_rows(conn, phase, as_of, 100).await? {
                    let reason = match row.to_domain() {
                        Ok(booking) => booking
                            .expire(as_of)
                            .err()
                            .map_or_else(|| "none".to_owned(), |e| e.to_string()),
                        Err(e) => e.to_string(),
                    };
                    poison.push(PoisonRow {
                        booking_id: row.id,
                        tenant_id: row.tenant_id,
                        phase: phase.as_str(),
                        status: row.status.clone(),
                        deadline: row.deadline(phase),
                        reason,
                    });
                }
            }
            let outbox = db::outbox::stats(conn).await?;
            let parked = db::outbox::parked_rows(conn, 100).await?;
            Ok::<_, DbError>(StatusReport {
                as_of,
                phases,
                outbox_unpublished: outbox.unpublished,
                outbox_oldest_unpublished_at: outbox.oldest_unpublished_at,
                outbox_oldest_unpublished_age_seconds: outbox
                    .oldest_unpublished_at
                    .map_or(0, |t| (as_of - t).num_seconds().max(0)),
                poison,
                outbox_parked: outbox.parked,
                parked,
            })
        })
        .await?;
    Ok(report)
}

impl std::fmt::Display for StatusReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
            t.map_or_else(
                || "-".to_owned(),
                |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            )
        };
        writeln!(f, "as of {}", time(Some(self.as_of)))?;
        writeln!(f, "{:<10} {:>10}  oldest due deadline", "phase", "backlog")?;
        for p in &self.phases {
            writeln!(
                f,
                "{:<10} {:>10}  {}",
                p.phase,
                p.backlog,
                time(p.oldest_due_deadline)
            )?;
        }
        writeln!(
            f,
            "outbox     {:>10}  unpublished, oldest {} ({} s)",
            self.outbox_unpublished,
            time(self.outbox_oldest_unpublished_at),
            self.outbox_oldest_unpublished_age_seconds
        )?;
        writeln!(f, "poison rows: {}", self.poison.len())?;
        for p in &self.poison {
            writeln!(
                f,
                "  {} tenant {} {} {} deadline {}: {}",
                p.booking_id,
                p.tenant_id,
                p.phase,
                p.status,
                time(p.deadline),
                p.reason
            )?;
        }
        writeln!(f, "parked outbox rows: {}", self.outbox_parked)?;
        for p in &self.parked {
            writeln!(
                f,
                "  event {} booking {} parked {}: {}",
                p.event_id,
                p.message_key,
                time(Some(p.parked_at)),
                p.reason
            )?;
        }
        Ok(())
    }
}
