//! Booking statuses and the two expiry phases: the one definition of
//! phase → active statuses → deadline field → target status. The SQL
//! predicates, the seeder, `status` and the benches derive from it; only
//! the migration restates it, and a test compares the two.

use std::{fmt, str::FromStr};

/// A booking's status, spelled exactly as in the `bookings.status` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Reserved,
    AwaitingPayment,
    Booked,
    ReserveExpired,
    BookingExpired,
    Cancelled,
    Confirmed,
}

impl Status {
    /// Every status, in declaration order.
    pub const ALL: [Status; 7] = [
        Status::Reserved,
        Status::AwaitingPayment,
        Status::Booked,
        Status::ReserveExpired,
        Status::BookingExpired,
        Status::Cancelled,
        Status::Confirmed,
    ];

    /// The column value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Reserved => "Reserved",
            Status::AwaitingPayment => "AwaitingPayment",
            Status::Booked => "Booked",
            Status::ReserveExpired => "ReserveExpired",
            Status::BookingExpired => "BookingExpired",
            Status::Cancelled => "Cancelled",
            Status::Confirmed => "Confirmed",
        }
    }

    /// The phase whose timer runs in this status, or `None` when the
    /// status is not active (terminal or otherwise out of scope).
    pub const fn active_phase(self) -> Option<Phase> {
        match self {
            Status::Reserved | Status::AwaitingPayment => Some(Phase::Reserve),
            Status::Booked => Some(Phase::Booking),
            Status::ReserveExpired
            | Status::BookingExpired
            | Status::Cancelled
            | Status::Confirmed => None,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status string that is none of the known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown booking status {0:?}")]
pub struct UnknownStatus(pub String);

impl FromStr for Status {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Status::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

/// The two timers of a booking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// `Reserved` / `AwaitingPayment` until `reserve_expires_at`.
    Reserve,
    /// `Booked` until `booking_expires_at`.
    Booking,
}

impl Phase {
    /// Both phases, in the order a cycle takes them.
    pub const ALL: [Phase; 2] = [Phase::Reserve, Phase::Booking];

    /// The statuses in which this phase's timer runs.
    pub const fn active_statuses(self) -> &'static [Status] {
        match self {
            Phase::Reserve => &[Status::Reserved, Status::AwaitingPayment],
            Phase::Booking => &[Status::Booked],
        }
    }

    /// The name of the booking field holding this phase's deadline, which
    /// is also its `bookings` column.
    pub const fn deadline_field(self) -> &'static str {
        match self {
            Phase::Reserve => "reserve_expires_at",
            Phase::Booking => "booking_expires_at",
        }
    }

    /// This phase's deadline out of a booking's two deadlines, given in
    /// field order (`reserve_expires_at`, `booking_expires_at`): for row
    /// types outside the domain that carry both fields.
    pub fn deadline_of<T>(self, reserve_expires_at: T, booking_expires_at: T) -> T {
        match self {
            Phase::Reserve => reserve_expires_at,
            Phase::Booking => booking_expires_at,
        }
    }

    /// The terminal status an expiry of this phase leads to.
    pub const fn target_status(self) -> Status {
        match self {
            Phase::Reserve => Status::ReserveExpired,
            Phase::Booking => Status::BookingExpired,
        }
    }

    /// Every status in which some phase's timer runs, phase by phase.
    pub fn all_active_statuses() -> impl Iterator<Item = Status> {
        Phase::ALL
            .into_iter()
            .flat_map(|phase| phase.active_statuses().iter().copied())
    }

    /// Lowercase label for metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Reserve => "reserve",
            Phase::Booking => "booking",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Reserve => "Reserve",
            Phase::Booking => "Booking",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_through_their_column_value() {
        for status in Status::ALL {
            assert_eq!(status.as_str().parse::<Status>(), Ok(status));
        }
        assert_eq!(
            "reserved".parse::<Status>(),
            Err(UnknownStatus("reserved".into()))
        );
    }

    #[test]
    fn phases_own_exactly_the_active_statuses() {
        for status in Status::ALL {
            let owners: Vec<Phase> = Phase::ALL
                .into_iter()
                .filter(|p| p.active_statuses().contains(&status))
                .collect();
            assert_eq!(
                owners,
                status.active_phase().into_iter().collect::<Vec<_>>()
            );
        }
        for phase in Phase::ALL {
            assert_eq!(
                phase.target_status().active_phase(),
                None,
                "targets are terminal"
            );
        }
        assert_eq!(
            Phase::all_active_statuses().collect::<Vec<_>>(),
            Status::ALL
                .into_iter()
                .filter(|s| s.active_phase().is_some())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn deadline_field_and_deadline_of_name_the_same_field() {
        for phase in Phase::ALL {
            assert_eq!(
                phase.deadline_of("reserve_expires_at", "booking_expires_at"),
                phase.deadline_field()
            );
        }
        assert_ne!(
            Phase::Reserve.deadline_field(),
            Phase::Booking.deadline_field()
        );
    }

    /// Status values are written into SQL as literals: they must need no
    /// quoting.
    #[test]
    fn status_values_are_plain_identifiers() {
        for status in Status::ALL {
            assert!(
                status.as_str().chars().all(|c| c.is_ascii_alphanumeric()),
                "{status}"
            );
        }
    }
}
