//! What a cycle reports: the `once` command's JSON line ([`CycleReport`]),
//! what logs, the scheduler and tests read besides ([`CycleOutcome`]), and
//! why a cycle ended without completing ([`CycleError`]).

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::{
    db::DbError,
    domain::{Phase, RunId},
};

/// The result of a cycle, exactly the JSON line `once` prints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CycleReport {
    pub reserve_expired_count: u64,
    pub booking_expired_count: u64,
    pub skipped_locked_count: u64,
    pub duration_ms: u64,
}

impl CycleReport {
    /// Bookings the cycle expired, both phases.
    pub fn expired(&self) -> u64 {
        self.reserve_expired_count + self.booking_expired_count
    }
}

/// The report plus what logs and tests need besides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CycleOutcome {
    pub run_id: RunId,
    pub as_of: DateTime<Utc>,
    pub report: CycleReport,
    /// Rows the domain refused (left untouched for the next cycle).
    pub poison_count: u64,
    /// Rows whose version or status changed between read and write.
    pub version_conflicts: u64,
    pub batches: u32,
    /// Stopped early: the time budget ran out while batches were still full.
    pub budget_exhausted: bool,
    /// A phase stopped at `EXPIRATION_MAX_BATCHES_PER_CYCLE` with its last
    /// batch full: more of its rows may be due (after the sweep's position).
    pub batch_cap_reached: bool,
    /// How far the local clock ran ahead of the database clock when that
    /// was more than `EXPIRATION_MAX_CLOCK_SKEW` (`as_of` was clamped).
    pub clamped_ahead_by: Option<chrono::Duration>,
}

impl CycleOutcome {
    /// A cycle at `as_of` that has done nothing yet.
    pub(super) fn started(run_id: RunId, as_of: DateTime<Utc>) -> Self {
        Self {
            run_id,
            as_of,
            report: CycleReport::default(),
            poison_count: 0,
            version_conflicts: 0,
            batches: 0,
            budget_exhausted: false,
            batch_cap_reached: false,
            clamped_ahead_by: None,
        }
    }
}

/// Why a cycle ended without completing. Batches committed before the
/// error stay committed; the failed batch rolled back whole.
#[derive(Debug, thiserror::Error)]
pub enum CycleError {
    #[error("database error in the {phase} phase")]
    Database {
        phase: Phase,
        #[source]
        source: DbError,
    },
    #[error("cannot get a database connection")]
    Connection(#[source] DbError),
    #[error("stopped by shutdown")]
    Cancelled,
}
