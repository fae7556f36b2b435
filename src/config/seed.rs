//! What `seed` inserts.

use std::time::Duration;

use clap::Args;

use super::{
    defaults::{self, text},
    parse::{self, setting},
    ranges,
};

/// A validated `seed` request.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct SeedSettings {
    /// Active bookings (Reserved, AwaitingPayment and Booked in turn); 0 to 100000000.
    #[arg(long, default_value = text!(defaults::SEED_ACTIVE), value_parser = parse::count_within::<u64>(&ranges::SEED_ACTIVE))]
    pub active: u64,
    /// Share of the active bookings already due (0.0-1.0).
    #[arg(long, default_value = text!(defaults::SEED_DUE_FRACTION), value_parser = setting(parse::fraction))]
    pub due_fraction: f64,
    /// Terminal or inactive rows beside them; 0 to 100000000.
    #[arg(long, default_value = text!(defaults::SEED_NONE), value_parser = parse::count_within::<u64>(&ranges::SEED_INACTIVE))]
    pub inactive: u64,
    /// Due legacy rows without deal_id (poison); 0 to 100000000.
    #[arg(long, default_value = text!(defaults::SEED_NONE), value_parser = parse::count_within::<u64>(&ranges::SEED_POISON))]
    pub poison: u64,
    /// The not-yet-due deadlines are spread over this span from now; 0s to 365d.
    #[arg(long, default_value = text!(defaults::SEED_SPREAD), value_parser = parse::within(&ranges::SEED_SPREAD))]
    pub spread: Duration,
}
