//! What `seed` inserts.

use std::time::Duration;

use super::{catalog::*, setting::group};

group! {
    /// A validated `seed` request.
    #[derive(Debug, Clone, PartialEq)]
    pub struct SeedSettings: Default {
        pub active: u64 = SEED_ACTIVE,
        pub due_fraction: f64 = SEED_DUE_FRACTION,
        pub inactive: u64 = SEED_INACTIVE,
        pub poison: u64 = SEED_POISON,
        pub spread: Duration = SEED_SPREAD,
    }
}
