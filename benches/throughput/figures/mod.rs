//! The figures of the run, one module each. Every figure measures its
//! project side and its baseline in the same run and returns a typed result
//! (part of [`crate::results::Results`]); none of them prints a table: that
//! is [`crate::render`]'s job.

pub mod deadline_wake;
pub mod drain;
pub mod drain_stats;
pub mod end_to_end;
pub mod expiry;
pub mod idle;
pub mod kafka_tls;
pub mod logging;
pub mod migrations;
pub mod outbox_cost;
pub mod profile;
pub mod publisher;
pub mod replay;
pub mod schema_cost;
pub mod sustained;

use anyhow::Result;
use booking_expiration::db::{self, PgPool};

use crate::support::db_settings;

/// The topic every figure but end to end publishes to.
pub const TOPIC: &str = booking_expired_proto::TOPIC;
/// `ce_source` of the events the worker and the raw-SQL baseline write.
pub const SOURCE: &str = "/pin/crm/booking-expiration";

/// Repetitions of a figure: `full`, or a third of it (at least 1) in quick mode.
pub fn reps(quick: bool, full: usize) -> usize {
    if quick { (full / 3).max(1) } else { full }
}

/// Opens `instances` pools on `url` (one warm connection each, so the
/// timing starts with connections open, as in a running service).
pub async fn pools(url: &str, instances: usize) -> Result<Vec<PgPool>> {
    let mut out = Vec::new();
    for _ in 0..instances {
        let pool = db::build_pool(&db_settings(url, 2));
        drop(pool.get().await?);
        out.push(pool);
    }
    Ok(out)
}
