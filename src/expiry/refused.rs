//! Rows the domain refused (poison rows), remembered from one cycle to the
//! next so they cannot keep the rows behind them from expiring.
//!
//! Within a cycle every refused row is left out of the cycle's later
//! batches. Across cycles the scheduler keeps them here and the next cycles
//! leave them out too: with `EXPIRATION_MAX_BATCHES_PER_CYCLE=1`, a batch of
//! poison rows with the oldest deadlines would otherwise be selected again by
//! every cycle, and nothing behind it would ever expire. The memory is
//! bounded ([`RefusedRows::new`]) and emptied at every regular tick, so each
//! poison row is still tried again (logged at ERROR and counted in
//! `errors_total`) once per interval, and a row crm repaired meanwhile is
//! expired at the latest by the tick after its repair.

use uuid::Uuid;

use crate::domain::Phase;

/// The fewest refused rows remembered per phase: several default batches.
pub const MIN_REMEMBERED_PER_PHASE: usize = 1_000;

/// Refused rows per phase, at most `limit` each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedRows {
    /// Indexed by `phase as usize`, the phase's place in `Phase::ALL`.
    ids: [Vec<Uuid>; 2],
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
            ids: [Vec::new(), Vec::new()],
            limit,
        }
    }

    /// The rows of `phase` the next cycle leaves out.
    pub fn ids(&self, phase: Phase) -> &[Uuid] {
        &self.ids[phase as usize]
    }

    /// Remembers `refused` rows of `phase` while there is room; returns how
    /// many were added (ids already remembered are not added twice).
    pub fn remember(&mut self, phase: Phase, refused: &[Uuid]) -> usize {
        let ids = &mut self.ids[phase as usize];
        let before = ids.len();
        for id in refused {
            if ids.len() >= self.limit {
                break;
            }
            if !ids.contains(id) {
                ids.push(*id);
            }
        }
        ids.len() - before
    }

    /// Forgets every row: the next cycle tries them all again.
    pub fn clear(&mut self) {
        self.ids.iter_mut().for_each(Vec::clear);
    }

    /// Rows remembered over both phases.
    pub fn len(&self) -> usize {
        self.ids.iter().map(Vec::len).sum()
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
        assert_eq!(refused.ids(Phase::Reserve), first.as_slice());
        assert!(refused.ids(Phase::Booking).is_empty());
        assert_eq!(refused.len(), 3);
        refused.clear();
        assert!(refused.is_empty());
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
        // order) are kept; a full memory adds nothing more.
        assert_eq!(
            refused.ids(Phase::Booking),
            &many[..MIN_REMEMBERED_PER_PHASE]
        );
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
