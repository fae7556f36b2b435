//! Rows held back from the next batches: the ones a partly acknowledged
//! batch left pending (their partition failing while others were
//! acknowledged). The claim takes the oldest rows first, so without this a
//! partition that stays unwritable would fill every batch with its own
//! backlog and hold back partitions that are fine. A held row is claimed
//! (locked) but not sent until its hold ends, then sent again with the
//! next batch; new rows of its partition keep being sent meanwhile, so the
//! partition is tried with every batch and resumes as soon as it can.
//! Bounded: past `max` rows nothing more is held (the rows are then sent
//! oldest first, as without holds).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

#[derive(Debug)]
pub(crate) struct HeldBack {
    until: HashMap<i64, Instant>,
    max: usize,
}

impl HeldBack {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            until: HashMap::new(),
            max,
        }
    }

    /// Drops the holds that ended by `now`; returns how many remain.
    pub(crate) fn release(&mut self, now: Instant) -> usize {
        self.until.retain(|_, until| *until > now);
        self.until.len()
    }

    /// Whether row `id` is held at `now`.
    pub(crate) fn holds(&self, id: i64, now: Instant) -> bool {
        self.until.get(&id).is_some_and(|until| *until > now)
    }

    /// Holds `ids` until `until`, as far as there is room; returns how
    /// many were held.
    pub(crate) fn hold(&mut self, ids: impl IntoIterator<Item = i64>, until: Instant) -> usize {
        let mut held = 0;
        for id in ids {
            if self.until.len() >= self.max && !self.until.contains_key(&id) {
                break;
            }
            self.until.insert(id, until);
            held += 1;
        }
        held
    }

    /// How long until the first hold ends (`None`: nothing held).
    pub(crate) fn next_release(&self, now: Instant) -> Option<Duration> {
        self.until
            .values()
            .min()
            .map(|until| until.saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_until_their_end_then_releases() {
        let t0 = Instant::now();
        let mut held = HeldBack::new(10);
        assert_eq!(held.hold([1, 2], t0 + Duration::from_millis(500)), 2);
        assert_eq!(held.hold([3], t0 + Duration::from_millis(800)), 1);
        assert!(held.holds(1, t0) && held.holds(3, t0) && !held.holds(4, t0));
        assert_eq!(held.next_release(t0), Some(Duration::from_millis(500)));
        let later = t0 + Duration::from_millis(600);
        assert!(!held.holds(1, later) && held.holds(3, later));
        assert_eq!(held.release(later), 1);
        assert_eq!(held.next_release(later), Some(Duration::from_millis(200)));
        assert_eq!(held.release(t0 + Duration::from_secs(1)), 0);
        assert_eq!(held.next_release(t0), None);
    }

    #[test]
    fn never_holds_more_than_its_bound() {
        let t0 = Instant::now();
        let mut held = HeldBack::new(3);
        let until = t0 + Duration::from_secs(1);
        assert_eq!(held.hold(1..=5, until), 3);
        assert_eq!(held.release(t0), 3);
        assert!(!held.holds(4, t0));
        // A row already held has its hold renewed even when full.
        assert_eq!(held.hold([2], t0 + Duration::from_secs(2)), 1);
        assert_eq!(held.release(until), 1);
    }
}
