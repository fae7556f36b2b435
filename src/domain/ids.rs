//! Typed identifiers, so a tenant id can never be passed as a booking id.

use std::fmt;
use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            /// Wraps a UUID.
            pub const fn new(id: Uuid) -> Self {
                Self(id)
            }

            /// The underlying UUID.
            pub const fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl From<Uuid> for $name {
            fn from(id: Uuid) -> Self {
                Self(id)
            }
        }

        impl fmt::Display for $name {
            /// Canonical lowercase hyphenated form: the Kafka key format.
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }
    };
}

uuid_id!(
    /// Primary key of a booking; the Kafka message key.
    BookingId
);
uuid_id!(
    /// The developer (tenant) owning a booking.
    TenantId
);
uuid_id!(
    /// The deal a booking belongs to.
    DealId
);
uuid_id!(
    /// The property object (apartment) a booking holds.
    PropertyObjectId
);
uuid_id!(
    /// One expiry cycle; used as the correlation id of everything it writes.
    RunId
);

impl RunId {
    /// A fresh random run id.
    pub fn generate() -> Self {
        Self(Uuid::new_v4())
    }
}
