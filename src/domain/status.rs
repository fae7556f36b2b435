//! Booking statuses and the two expiry phases.

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

    /// The terminal status an expiry of this phase leads to.
    pub const fn target_status(self) -> Status {
        match self {
            Phase::Reserve => Status::ReserveExpired,
            Phase::Booking => Status::BookingExpired,
        }
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
    }
}
