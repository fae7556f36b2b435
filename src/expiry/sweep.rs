//! Where each phase's sweep goes on from, carried from one cycle to the
//! next, so that rows the domain refuses (poison rows) never keep the rows
//! behind them from expiring, however many of them there are.
//!
//! A cycle takes the due rows of each phase in deadline order (then id),
//! batch after batch, and each batch starts just after the last row of the
//! one before: within a sweep no row is read twice, so a poison row is
//! refused once and passed, and the rows behind it are reached whatever the
//! number of poison rows in front. The position outlives the cycle. A cycle
//! that stops at `EXPIRATION_MAX_BATCHES_PER_CYCLE` or at its budget leaves
//! it where the next cycle goes on, and the cycles woken by deadlines go on
//! from it too, so the rows a sweep passed over (poison rows, and rows
//! skipped because someone else held them) are not read again by every
//! cycle.
//!
//! At a regular tick, a phase whose sweep has reached the end of its due
//! rows (a batch came back short) starts over from the oldest deadline:
//! that sweep reads every due row again, so each poison row is tried again
//! (logged at ERROR and counted in `errors_total`) about once per interval,
//! a row crm repaired meanwhile expires then, and so does a row skipped
//! because it was locked. A sweep still on its way at a tick goes on: no
//! tick cuts it short, so every due row is reached.
//!
//! The bound: with `B` rows per batch and a cap of one batch per cycle, a
//! sweep that starts with `P` poison rows and `G` good rows due reaches
//! every good one within `⌈(P + G) / B⌉` cycles; the cycles after a capped
//! one follow after `EXPIRATION_MIN_GAP`. What is remembered is one
//! position and one flag per phase: constant memory.

use crate::{db::bookings::Position, domain::Phase};

/// One phase's sweep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct PhaseSweep {
    /// The last row the sweep took (expired, refused or left as it was);
    /// `None`: the next batch starts at the oldest deadline.
    after: Option<Position>,
    /// A batch came back short since the sweep started: it has been
    /// through every due row it could lock.
    reached_end: bool,
}

/// The sweep of both phases (indexed by `phase as usize`, its place in
/// `Phase::ALL`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sweep {
    phases: [PhaseSweep; 2],
}

impl Sweep {
    /// Where the next batch of `phase` starts: after this row.
    pub fn after(&self, phase: Phase) -> Option<Position> {
        self.phases[phase as usize].after
    }

    /// A committed batch of `phase`: the last row it took (`None`: it took
    /// none) and whether it was full.
    pub fn batch_done(&mut self, phase: Phase, last: Option<Position>, full: bool) {
        let state = &mut self.phases[phase as usize];
        if let Some(last) = last {
            state.after = Some(last);
        }
        if !full {
            state.reached_end = true;
        }
    }

    /// A regular tick: a phase whose sweep reached the end starts over.
    pub fn tick(&mut self) {
        for state in &mut self.phases {
            if state.reached_end {
                *state = PhaseSweep::default();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use uuid::Uuid;

    use super::*;

    fn at(secs: i64) -> Position {
        Position {
            deadline: DateTime::<Utc>::from_timestamp(1_800_000_000 + secs, 0).expect("a time"),
            id: Uuid::from_u128(secs as u128),
        }
    }

    #[test]
    fn batches_go_on_after_the_last_row_per_phase() {
        let mut sweep = Sweep::default();
        assert_eq!(sweep.after(Phase::Reserve), None, "from the start");
        sweep.batch_done(Phase::Reserve, Some(at(5)), true);
        assert_eq!(sweep.after(Phase::Reserve), Some(at(5)));
        assert_eq!(sweep.after(Phase::Booking), None, "per phase");
        // An empty batch keeps the position.
        sweep.batch_done(Phase::Reserve, None, false);
        assert_eq!(sweep.after(Phase::Reserve), Some(at(5)));
    }

    #[test]
    fn a_tick_starts_over_only_a_sweep_that_reached_the_end() {
        let mut sweep = Sweep::default();
        sweep.batch_done(Phase::Reserve, Some(at(5)), true);
        sweep.batch_done(Phase::Booking, Some(at(9)), false);
        sweep.tick();
        assert_eq!(
            sweep.after(Phase::Reserve),
            Some(at(5)),
            "still on its way: a tick does not cut it short"
        );
        assert_eq!(
            sweep.after(Phase::Booking),
            None,
            "reached the end: over again"
        );
        sweep.batch_done(Phase::Reserve, Some(at(7)), false);
        // Cycles between ticks go on from the end of the sweep.
        sweep.batch_done(Phase::Reserve, Some(at(8)), true);
        assert_eq!(sweep.after(Phase::Reserve), Some(at(8)));
        sweep.tick();
        assert_eq!(sweep.after(Phase::Reserve), None);
        assert_eq!(sweep, Sweep::default());
    }
}
