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

/// What the audit trail and the booking keep of one expiry: enough to
/// rebuild its event exactly (`republish`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiryRecord {
    pub booking_id: BookingId,
    pub tenant_id: TenantId,
    pub deal_id: Option<DealId>,
    pub property_object_id: Option<PropertyObjectId>,
    pub from_status: Status,
    pub to_status: Status,
    /// The booking's deadline of the phase that expired.
    pub deadline: Option<DateTime<Utc>>,
    /// The cycle's `as_of`, the audit record's `at`.
    pub expired_at: DateTime<Utc>,
    /// The booking's version after the transition.
    pub version: i64,
}

/// Why an expiry record cannot give back its event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RebuildError {
    #[error("{from} -> {to} is not an expiry")]
    NotAnExpiry { from: Status, to: Status },
    #[error("deal_id is missing")]
    MissingDealId,
    #[error("property_object_id is missing")]
    MissingPropertyObjectId,
    #[error("the booking has no {phase} deadline")]
    NoDeadline { phase: Phase },
}

impl ExpiryRecord {
    /// The `BookingExpired` the transition raised, as `Booking::expire` built it.
    pub fn rebuild(&self) -> Result<BookingExpired, RebuildError> {
        let not_expiry = RebuildError::NotAnExpiry {
            from: self.from_status,
            to: self.to_status,
        };
        let phase = self.from_status.active_phase().ok_or(not_expiry.clone())?;
        if phase.target_status() != self.to_status {
            return Err(not_expiry);
        }
        Ok(BookingExpired {
            booking_id: self.booking_id,
            tenant_id: self.tenant_id,
            deal_id: self.deal_id.ok_or(RebuildError::MissingDealId)?,
            property_object_id: self
                .property_object_id
                .ok_or(RebuildError::MissingPropertyObjectId)?,
            phase,
            from_status: self.from_status,
            to_status: self.to_status,
            deadline: self.deadline.ok_or(RebuildError::NoDeadline { phase })?,
            expired_at: self.expired_at,
            version: self.version,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Booking;
    use chrono::TimeZone;
    use proptest::prelude::*;
    use uuid::Uuid;

    proptest! {
        /// What an expiry leaves in the audit trail and the booking gives
        /// back the event it raised.
        #[test]
        fn record_of_an_expiry_rebuilds_its_event(
            seed in any::<u128>(),
            status in proptest::sample::select(vec![Status::Reserved, Status::AwaitingPayment, Status::Booked]),
            deadline in 0i64..1_000_000,
            late in 1i64..1_000_000,
            version in 0i64..1_000_000,
        ) {
            let at = |s: i64| Utc.timestamp_opt(1_800_000_000 + s, 0).single().unwrap();
            let booking = Booking {
                id: BookingId::new(Uuid::from_u128(seed)),
                tenant_id: TenantId::new(Uuid::from_u128(seed ^ 1)),
                deal_id: Some(DealId::new(Uuid::from_u128(seed ^ 2))),
                property_object_id: Some(PropertyObjectId::new(Uuid::from_u128(seed ^ 3))),
                status,
                reserve_expires_at: Some(at(deadline)),
                booking_expires_at: Some(at(deadline)),
                expired_at: None,
                updated_at: at(0),
                version,
            };
            let expiry = booking.expire(at(deadline + late)).unwrap();
            let after = &expiry.booking;
            let phase = expiry.event.phase;
            let record = ExpiryRecord {
                booking_id: after.id,
                tenant_id: after.tenant_id,
                deal_id: after.deal_id,
                property_object_id: after.property_object_id,
                from_status: status,
                to_status: after.status,
                deadline: after.deadline(phase),
                expired_at: after.expired_at.unwrap(),
                version: after.version,
            };
            prop_assert_eq!(record.rebuild(), Ok(expiry.event));
        }
    }

    #[test]
    fn only_expiries_rebuild() {
        let record = ExpiryRecord {
            booking_id: BookingId::new(Uuid::from_u128(1)),
            tenant_id: TenantId::new(Uuid::from_u128(2)),
            deal_id: Some(DealId::new(Uuid::from_u128(3))),
            property_object_id: Some(PropertyObjectId::new(Uuid::from_u128(4))),
            from_status: Status::Booked,
            to_status: Status::ReserveExpired,
            deadline: Some(Utc.timestamp_opt(0, 0).single().unwrap()),
            expired_at: Utc.timestamp_opt(1, 0).single().unwrap(),
            version: 2,
        };
        assert!(matches!(
            record.rebuild(),
            Err(RebuildError::NotAnExpiry { .. })
        ));
        let legacy = ExpiryRecord {
            to_status: Status::BookingExpired,
            deal_id: None,
            ..record.clone()
        };
        assert_eq!(legacy.rebuild(), Err(RebuildError::MissingDealId));
        let ok = ExpiryRecord {
            to_status: Status::BookingExpired,
            ..record
        };
        assert_eq!(ok.rebuild().unwrap().phase, Phase::Booking);
    }
}
