//! The booking aggregate's expiry rules: pure, no I/O, no database or
//! Kafka types. The repository feeds rows in, the cycle takes transitions
//! and events out.

mod booking;
mod event;
mod ids;
mod status;

pub use booking::{Booking, ExpireError, Expiry};
pub use event::{BookingExpired, DomainEventSubscriber, ExpiryRecord, RebuildError};
pub use ids::{BookingId, DealId, PropertyObjectId, RunId, TenantId};
pub use status::{Phase, Status, UnknownStatus};

/// The actor recorded in the audit trail for every worker transition.
pub const SYSTEM_ACTOR: &str = "system";
