//! Rows the domain refused (poison rows), remembered from one cycle to the
//! next so they cannot keep the rows behind them from expiring.
//!
//! Within a cycle every refused row is left out of the cycle's later
//! batches. Across cycles the scheduler keeps them here and the next cycles
//! leave them out too: with `EXPIRATION_MAX_BATCHES_PER_CYCLE=1`, a batch of
//! poison rows with the oldest deadlines would otherwise be selected again by
//! every cycle, and nothing behind it would ever expire.
//!
//! A refused row stays set aside for the rest of the interval in which it
//! was refused and the whole interval after it: the scheduler calls
//! [`RefusedRows::tick`] at each regular tick, which forgets what the
//! previous tick kept. So each poison row is tried again (logged at ERROR and
//! counted in `errors_total`) every second interval, and on the fixed
//! schedule, where every cycle is a tick, every other cycle takes the rows
//! behind it. A row crm repaired meanwhile expires at the latest two ticks
//! after its repair. The memory is bounded ([`RefusedRows::new`]).

use uuid::Uuid;

use crate::domain::Phase;

/// The fewest refused rows remembered per phase: several default batches.
pub const MIN_REMEMBERED_PER_PHASE: usize = 1_000;

/// Refused rows per phase, at most `limit` each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedRows {
    /// Per phase (indexed by `phase as usize`, its place in `Phase::ALL`):
    /// refused since the last tick.
    recent: [Vec<Uuid>; 2],
    /// Per phase: refused in the interval before the last tick.
    older: [Vec<Uuid>; 2],
    limit: usize,
}

impl Default for RefusedRows {
    /// Nothing remembered, and nothing will be: what one cycle on its own
    /// (`once`) starts with.
    fn default() -> Self {
        Self::with_limit(0)
    }
}

impl RefusedRows {
    /// An empty memory that keeps at least one batch of refused rows per
    /// phase, and never fewer than [`MIN_REMEMBERED_PER_PHASE`]. Each
    /// remembered id is sent with every candidate query of its phase (16
    /// bytes each), so the bound also bounds that.
    pub fn new(batch_size: u32) -> Self {
        Self::with_limit((batch_size as usize).max(MIN_REMEMBERED_PER_PHASE))
    }

    fn with_limit(limit: usize) -> Self {
        Self {
            recent: [Vec::new(), Vec::new()],
            older: [Vec::new(), Vec::new()],
            limit,
        }
    }

    /// The rows of `phase` the next cycle leaves out.
    pub fn ids(&self, phase: Phase) -> Vec<Uuid> {
        let i = phase as usize;
        [self.older[i].as_slice(), self.recent[i].as_slice()].concat()
    }

    /// Remembers `refused` rows of `phase` while there is room; returns how
    /// many were added (ids already remembered are not added twice).
    pub fn remember(&mut self, phase: Phase, refused: &[Uuid]) -> usize {
        let i = phase as usize;
        let (older, recent) = (&self.older[i], &mut self.recent[i]);
        let before = recent.len();
        for id in refused {
            if older.len() + recent.len() >= self.limit {
                break;
            }
            if !older.contains(id) && !recent.contains(id) {
                recent.push(*id);
            }
        }
        recent.len() - before
    }

    /// A regular tick: forgets the rows refused before the previous tick
    /// (the next cycle tries them again) and keeps those refused since.
    pub fn tick(&mut self) {
        for (older, recent) in self.older.iter_mut().zip(&mut self.recent) {
            *older = std::mem::take(recent);
        }
    }

    /// Rows remembered over both phases.
    pub fn len(&self) -> usize {
        self.older.iter().chain(&self.recent).map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<Uuid> {
        (0..n).map(|_| Uuid::new_v4()).collect()
    }

    #[test]
    fn remembers_per_phase_without_duplicates() {
        let mut refused = RefusedRows::new(200);
        let first = ids(3);
        assert_eq!(refused.remember(Phase::Reserve, &first), 3);
        assert_eq!(refused.remember(Phase::Reserve, &first[..2]), 0);
        assert_eq!(refused.ids(Phase::Reserve), first);
        assert!(refused.ids(Phase::Booking).is_empty());
        assert_eq!(refused.len(), 3);
        // Kept across one tick (not added again), forgotten at the second.
        refused.tick();
        assert_eq!(refused.remember(Phase::Reserve, &first), 0);
        assert_eq!(refused.ids(Phase::Reserve), first);
        refused.tick();
        assert!(refused.is_empty());
    }

    #[test]
    fn a_row_refused_again_after_it_was_forgotten_is_set_aside_again() {
        // The fixed schedule with one batch per cycle: every cycle is a
        // tick. Cycle 1 refuses the poison rows; cycle 2 leaves them out
        // and takes the rows behind them; cycle 3 tries them again.
        let mut refused = RefusedRows::new(5);
        let poison = ids(5);
        assert_eq!(refused.remember(Phase::Booking, &poison), 5);
        refused.tick();
        assert_eq!(refused.ids(Phase::Booking), poison, "left out at cycle 2");
        refused.tick();
        assert!(refused.ids(Phase::Booking).is_empty(), "tried at cycle 3");
        assert_eq!(refused.remember(Phase::Booking, &poison), 5);
    }

    #[test]
    fn the_memory_is_bounded_and_holds_at_least_a_batch() {
        let mut refused = RefusedRows::new(200);
        let many = ids(MIN_REMEMBERED_PER_PHASE + 50);
        assert_eq!(
            refused.remember(Phase::Booking, &many),
            MIN_REMEMBERED_PER_PHASE
        );
        // The first ones (the oldest deadlines: batches are in deadline
        // order) are kept; a full memory adds nothing more, also after a
        // tick (the older ones still count).
        assert_eq!(
            refused.ids(Phase::Booking),
            &many[..MIN_REMEMBERED_PER_PHASE]
        );
        assert_eq!(refused.remember(Phase::Booking, &ids(1)), 0);
        refused.tick();
        assert_eq!(refused.remember(Phase::Booking, &ids(1)), 0);
        let mut large_batches = RefusedRows::new(5_000);
        assert_eq!(large_batches.remember(Phase::Reserve, &ids(5_000)), 5_000);
        assert_eq!(large_batches.remember(Phase::Reserve, &ids(1)), 0);
    }

    #[test]
    fn a_single_cycle_remembers_nothing() {
        let mut refused = RefusedRows::default();
        assert_eq!(refused.remember(Phase::Reserve, &ids(2)), 0);
        assert!(refused.is_empty());
    }
}
