//! The `Booking` aggregate and its one transition the worker makes:
//! `expire(as_of)`.

use chrono::{DateTime, Utc};

use super::{BookingExpired, BookingId, DealId, Phase, PropertyObjectId, Status, TenantId};

/// A booking as the worker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Booking {
    pub id: BookingId,
    pub tenant_id: TenantId,
    /// `None` only in legacy rows; such a row cannot expire (poison).
    pub deal_id: Option<DealId>,
    /// `None` only in legacy rows; such a row cannot expire (poison).
    pub property_object_id: Option<PropertyObjectId>,
    pub status: Status,
    pub reserve_expires_at: Option<DateTime<Utc>>,
    pub booking_expires_at: Option<DateTime<Utc>>,
    pub expired_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

/// Why `expire` refused a booking. Every variant leaves the booking as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpireError {
    /// INV-BKG-8: terminal (or otherwise inactive) bookings never change.
    #[error("status {0} is not active")]
    NotActive(Status),
    /// An active booking without a deadline never expires.
    #[error("{phase} phase has no deadline")]
    NoDeadline { phase: Phase },
    /// The deadline has not passed (`deadline < as_of` is strict).
    #[error("deadline {deadline} is not before as_of {as_of}")]
    NotDue {
        deadline: DateTime<Utc>,
        as_of: DateTime<Utc>,
    },
    /// Legacy row: no event can be built without the deal.
    #[error("deal_id is missing")]
    MissingDealId,
    /// Legacy row: no event can be built without the property object.
    #[error("property_object_id is missing")]
    MissingPropertyObjectId,
    /// The version counter cannot grow any more.
    #[error("version {0} cannot be incremented")]
    VersionOverflow(i64),
}

/// The result of a successful `expire`: the new state and its event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expiry {
    pub booking: Booking,
    pub event: BookingExpired,
}

impl Booking {
    /// The deadline of `phase`.
    pub fn deadline(&self, phase: Phase) -> Option<DateTime<Utc>> {
        phase.deadline_of(self.reserve_expires_at, self.booking_expires_at)
    }

    /// The phase the booking is in now, if it is active.
    pub fn phase(&self) -> Option<Phase> {
        self.status.active_phase()
    }

    /// Whether the booking's timer has passed at `as_of` (the selection
    /// predicate, in domain terms).
    pub fn is_due(&self, as_of: DateTime<Utc>) -> bool {
        self.phase()
            .and_then(|phase| self.deadline(phase))
            .is_some_and(|deadline| deadline < as_of)
    }

    /// Moves an active booking whose deadline passed to its terminal
    /// expired status, raising `BookingExpired`.
    ///
    /// Finds the phase from the current status, then checks the guards in
    /// order: active (INV-BKG-8), has a deadline, deadline strictly before
    /// `as_of`, and has what the integration event needs. Sets status,
    /// `expired_at` and `updated_at` to `as_of`, and the version + 1.
    pub fn expire(&self, as_of: DateTime<Utc>) -> Result<Expiry, ExpireError> {
        let phase = self.phase().ok_or(ExpireError::NotActive(self.status))?;
        let deadline = self
            .deadline(phase)
            .ok_or(ExpireError::NoDeadline { phase })?;
        if deadline >= as_of {
            return Err(ExpireError::NotDue { deadline, as_of });
        }
        let deal_id = self.deal_id.ok_or(ExpireError::MissingDealId)?;
        let property_object_id = self
            .property_object_id
            .ok_or(ExpireError::MissingPropertyObjectId)?;
        let version = self
            .version
            .checked_add(1)
            .ok_or(ExpireError::VersionOverflow(self.version))?;
        let to_status = phase.target_status();
        let booking = Booking {
            status: to_status,
            expired_at: Some(as_of),
            updated_at: as_of,
            version,
            ..self.clone()
        };
        let event = BookingExpired {
            booking_id: self.id,
            tenant_id: self.tenant_id,
            deal_id,
            property_object_id,
            phase,
            from_status: self.status,
            to_status,
            deadline,
            expired_at: as_of,
            version,
        };
        Ok(Expiry { booking, event })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, TimeZone};
    use proptest::prelude::*;
    use uuid::Uuid;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + seconds, 0)
            .single()
            .unwrap()
    }

    fn booking(status: Status, reserve: Option<i64>, booking: Option<i64>) -> Booking {
        Booking {
            id: BookingId::new(Uuid::from_u128(1)),
            tenant_id: TenantId::new(Uuid::from_u128(2)),
            deal_id: Some(DealId::new(Uuid::from_u128(3))),
            property_object_id: Some(PropertyObjectId::new(Uuid::from_u128(4))),
            status,
            reserve_expires_at: reserve.map(at),
            booking_expires_at: booking.map(at),
            expired_at: None,
            updated_at: at(-1000),
            version: 7,
        }
    }

    #[test]
    fn reserved_past_reserve_deadline_expires_to_reserve_expired() {
        let expiry = booking(Status::Reserved, Some(-1), None)
            .expire(at(0))
            .unwrap();
        assert_eq!(expiry.booking.status, Status::ReserveExpired);
        assert_eq!(expiry.booking.expired_at, Some(at(0)));
        assert_eq!(expiry.booking.updated_at, at(0));
        assert_eq!(expiry.booking.version, 8);
        assert_eq!(expiry.event.phase, Phase::Reserve);
        assert_eq!(expiry.event.from_status, Status::Reserved);
        assert_eq!(expiry.event.deadline, at(-1));
        assert_eq!(expiry.event.version, 8);
    }

    #[test]
    fn awaiting_payment_expires_in_reserve_phase() {
        let expiry = booking(Status::AwaitingPayment, Some(-5), Some(-5))
            .expire(at(0))
            .unwrap();
        assert_eq!(expiry.event.phase, Phase::Reserve);
        assert_eq!(expiry.booking.status, Status::ReserveExpired);
    }

    #[test]
    fn booked_past_booking_deadline_expires_to_booking_expired() {
        // The reserve deadline is irrelevant in the Booking phase.
        let expiry = booking(Status::Booked, Some(1000), Some(-1))
            .expire(at(0))
            .unwrap();
        assert_eq!(expiry.booking.status, Status::BookingExpired);
        assert_eq!(expiry.event.phase, Phase::Booking);
        assert_eq!(
            expiry.event.deadline,
            at(-1),
            "the Booking phase's deadline"
        );
    }

    #[test]
    fn deadline_equal_to_as_of_is_not_due() {
        let err = booking(Status::Reserved, Some(0), None)
            .expire(at(0))
            .unwrap_err();
        assert!(matches!(err, ExpireError::NotDue { .. }));
    }

    #[test]
    fn null_deadline_never_expires() {
        let err = booking(Status::Booked, Some(-10), None)
            .expire(at(0))
            .unwrap_err();
        assert_eq!(
            err,
            ExpireError::NoDeadline {
                phase: Phase::Booking
            }
        );
    }

    #[test]
    fn legacy_rows_are_poison() {
        let mut legacy = booking(Status::Reserved, Some(-1), None);
        legacy.deal_id = None;
        assert_eq!(legacy.expire(at(0)), Err(ExpireError::MissingDealId));
        let mut legacy = booking(Status::Booked, None, Some(-1));
        legacy.property_object_id = None;
        assert_eq!(
            legacy.expire(at(0)),
            Err(ExpireError::MissingPropertyObjectId)
        );
    }

    #[test]
    fn terminal_bookings_never_change() {
        for status in [
            Status::ReserveExpired,
            Status::BookingExpired,
            Status::Cancelled,
            Status::Confirmed,
        ] {
            assert_eq!(
                booking(status, Some(-100), Some(-100)).expire(at(0)),
                Err(ExpireError::NotActive(status))
            );
        }
    }

    fn any_status() -> impl Strategy<Value = Status> {
        proptest::sample::select(Status::ALL.to_vec())
    }

    proptest! {
        /// The transition succeeds exactly when the selection predicate
        /// holds (for complete rows), and its result obeys INV-BKG-5/8.
        #[test]
        fn expire_matches_predicate_and_invariants(
            status in any_status(),
            reserve in proptest::option::of(-10_000i64..10_000),
            booked in proptest::option::of(-10_000i64..10_000),
            as_of in -10_000i64..10_000,
            version in 0i64..1_000_000,
        ) {
            let mut before = booking(status, reserve, booked);
            before.version = version;
            let as_of = at(as_of);
            match before.expire(as_of) {
                Ok(expiry) => {
                    prop_assert!(before.is_due(as_of));
                    let phase = status.active_phase().unwrap();
                    prop_assert_eq!(expiry.booking.status, phase.target_status());
                    prop_assert_eq!(expiry.booking.version, version + 1);
                    prop_assert_eq!(expiry.booking.expired_at, Some(as_of));
                    prop_assert!(before.deadline(phase).unwrap() < as_of);
                    // Expired exactly once: the result can never expire again.
                    prop_assert!(expiry.booking.expire(as_of + Duration::days(365)).is_err());
                    prop_assert_eq!(
                        Booking { status, expired_at: None, updated_at: before.updated_at, version, ..expiry.booking.clone() },
                        before.clone()
                    );
                }
                Err(_) => prop_assert!(!before.is_due(as_of)),
            }
        }
    }
}
