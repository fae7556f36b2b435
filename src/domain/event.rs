//! The domain event raised by an expiry, and its in-process subscribers.

use chrono::{DateTime, Utc};

use super::{BookingId, DealId, Phase, PropertyObjectId, Status, TenantId};

/// A booking's timer ran out and it became terminal (INV-BKG-5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookingExpired {
    pub booking_id: BookingId,
    pub tenant_id: TenantId,
    pub deal_id: DealId,
    pub property_object_id: PropertyObjectId,
    pub phase: Phase,
    pub from_status: Status,
    pub to_status: Status,
    /// The phase's deadline that passed (strictly before `expired_at`).
    pub deadline: DateTime<Utc>,
    /// The cycle's `as_of`.
    pub expired_at: DateTime<Utc>,
    /// The booking's version after the transition.
    pub version: i64,
}

/// An in-process consumer of domain events (the deal timeline is one).
///
/// Called only after the batch that raised the events committed, never
/// for a rolled-back batch. Must not block: it runs on the worker task.
pub trait DomainEventSubscriber: Send + Sync {
    /// Receives every event of one committed batch, in batch order.
    fn on_booking_expired(&self, events: &[BookingExpired]);
}
