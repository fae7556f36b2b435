//! Where a partition's next claim starts ([`Scan`]). Pure: time comes in as
//! an argument.

use tokio::time::Instant;

/// One partition's claim scan over its rows in `id` order.
///
/// Each claim goes on past the last row the one before it took, so the rows
/// it published (whose index entries stay until VACUUM removes them) are
/// not walked again: a claim costs what it takes, not the rows drained
/// before it. A row can become claimable behind the scan in two ways, and
/// the scan starts again from the partition's first row for each:
///
/// - **Announced.** Every way a row comes back on a writer's word notifies
///   the outbox channel at its commit: a row committed after one with a
///   greater id (the insert trigger), rows released by their instance, rows
///   put back from the parked ones (`outbox retry`). Once a claim comes
///   back short after such a notification (the partition's backlog is
///   through), the next starts from the first row: such a row is found no
///   later than a row written at that moment would be.
/// - **A lease that ran out.** A row whose instance died while it held the
///   lease (or whose handoff never reached the publisher) comes back when
///   its lease ends, and nobody says so. The scan starts from the first row
///   once a lease has passed since the last such start, backlog or not:
///   such a row is claimed within one lease of its lease's end.
///
/// Nothing else brings a row back, so a drain that nobody disturbs ends
/// where it is, instead of walking the entries of every row it published
/// to find nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scan {
    /// The next claim takes the rows past this id (0: from the first row).
    after: i64,
    /// When the last claim from the first row was asked (`None`: never).
    from_start_at: Option<Instant>,
    /// A notification came after that claim was asked: rows may have come
    /// back behind the scan.
    announced: bool,
}

impl Scan {
    /// Where the next claim starts.
    pub(crate) fn after(&self) -> i64 {
        self.after
    }

    /// Rows may have come back behind the scan (a commit notification).
    pub(crate) fn announce(&mut self) {
        self.announced = true;
    }

    /// The next claim starts from the first row (rows were laid out into
    /// the partition behind its scan).
    pub(crate) fn restart(&mut self) {
        self.after = 0;
    }

    /// A claim was asked at `now`, starting at [`Self::after`]: from the
    /// first row, it finds every row announced so far.
    pub(crate) fn asked(&mut self, now: Instant) {
        if self.after == 0 {
            self.from_start_at = Some(now);
            self.announced = false;
        }
    }

    /// The claim asked `room` rows past `asked_after` and took `taken`, the
    /// greatest id of them `last`; `now`, with rows leased for `lease`. A
    /// claim that took its whole room stopped inside a backlog; one that
    /// took less came to the end of the partition's claimable rows.
    pub(crate) fn claimed(
        &mut self,
        asked_after: i64,
        room: u32,
        (taken, last): (u32, i64),
        now: Instant,
        lease: std::time::Duration,
    ) {
        let lease_passed = self.from_start_at.is_none_or(|at| now >= at + lease);
        let pass_over = taken < room;
        self.after = if lease_passed || (pass_over && self.announced) {
            0
        } else if taken > 0 {
            last.max(asked_after)
        } else {
            asked_after
        };
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const LEASE: Duration = Duration::from_secs(15);

    /// A scan that asked from the first row at `at` and took `taken` of
    /// `room` up to id `last`.
    fn started(at: Instant, room: u32, taken: u32, last: i64) -> Scan {
        let mut scan = Scan::default();
        scan.asked(at);
        scan.claimed(0, room, (taken, last), at, LEASE);
        scan
    }

    #[test]
    fn a_backlog_is_claimed_onwards_and_a_quiet_pass_ends_where_it_is() {
        let t0 = Instant::now();
        let mut scan = started(t0, 100, 100, 250);
        assert_eq!(scan.after(), 250, "a full claim goes on past its last row");
        scan.asked(t0);
        scan.claimed(250, 100, (40, 400), t0, LEASE);
        assert_eq!(
            scan.after(),
            400,
            "the pass is through and nothing came back: no walk from the first row"
        );
        scan.asked(t0);
        scan.claimed(400, 100, (0, 0), t0, LEASE);
        assert_eq!(scan.after(), 400, "a claim that took nothing stays");
    }

    #[test]
    fn a_notification_restarts_the_scan_once_the_pass_is_through() {
        let t0 = Instant::now();
        let mut scan = started(t0, 100, 100, 250);
        scan.announce();
        scan.asked(t0);
        scan.claimed(250, 100, (100, 350), t0, LEASE);
        assert_eq!(scan.after(), 350, "inside the backlog the scan goes on");
        scan.asked(t0);
        scan.claimed(350, 100, (10, 360), t0, LEASE);
        assert_eq!(scan.after(), 0, "the pass is through: from the first row");
        scan.asked(t0);
        scan.claimed(0, 100, (5, 361), t0, LEASE);
        assert_eq!(
            scan.after(),
            361,
            "the walk from the first row found what was announced before it was asked"
        );
    }

    #[test]
    fn a_notification_during_the_walk_from_the_first_row_is_not_lost() {
        let t0 = Instant::now();
        let mut scan = started(t0, 100, 10, 20);
        scan.announce();
        scan.asked(t0);
        scan.claimed(20, 100, (0, 0), t0, LEASE);
        assert_eq!(scan.after(), 0, "announced: from the first row");
        scan.asked(t0);
        // Announced while that claim was on its way: it may not see it.
        scan.announce();
        scan.claimed(0, 100, (3, 30), t0, LEASE);
        assert_eq!(scan.after(), 0, "walked again from the first row");
        scan.asked(t0);
        scan.claimed(0, 100, (0, 0), t0, LEASE);
        assert_eq!(
            scan.after(),
            0,
            "a walk that took nothing stays at the start"
        );
    }

    #[test]
    fn the_scan_starts_from_the_first_row_once_a_lease_has_passed_backlog_or_not() {
        let t0 = Instant::now();
        let mut scan = started(t0, 100, 100, 250);
        scan.asked(t0 + LEASE - Duration::from_millis(1));
        scan.claimed(
            250,
            100,
            (100, 350),
            t0 + LEASE - Duration::from_millis(1),
            LEASE,
        );
        assert_eq!(scan.after(), 350, "within the lease the backlog goes on");
        scan.asked(t0 + LEASE);
        scan.claimed(350, 100, (100, 450), t0 + LEASE, LEASE);
        assert_eq!(scan.after(), 0, "a lease has passed: from the first row");
        scan.asked(t0 + LEASE);
        scan.claimed(0, 100, (100, 120), t0 + LEASE, LEASE);
        assert_eq!(
            scan.after(),
            120,
            "the walk took rows come back behind: on from there"
        );
    }
}
