//! Failures that last are reported once per `Timing::report_every`, not
//! once per try: the first failure of a partition (or topic, or the
//! database) is logged at once, then at most one line per period with the
//! number of tries that failed meanwhile, and one line when it is over.
//! The metrics count every try. One entry per failing subject, removed when
//! it recovers: bounded by the partitions.

use std::{collections::HashMap, time::Duration};

use tokio::time::Instant;

#[derive(Debug)]
struct Entry {
    logged_at: Instant,
    /// Failed tries since the last line.
    quiet: u64,
}

/// What to log for one failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Line {
    /// The subject's first failure.
    First,
    /// It still fails: this many tries failed since the last line.
    Still { failed: u64 },
}

#[derive(Debug)]
pub(crate) struct Reports {
    every: Duration,
    open: HashMap<String, Entry>,
}

impl Reports {
    pub(crate) fn new(every: Duration) -> Self {
        Self {
            every,
            open: HashMap::new(),
        }
    }

    /// A try of `subject` failed at `now`: the line to log, if one is due.
    pub(crate) fn failed(&mut self, subject: &str, now: Instant) -> Option<Line> {
        match self.open.get_mut(subject) {
            None => {
                self.open.insert(
                    subject.to_owned(),
                    Entry {
                        logged_at: now,
                        quiet: 0,
                    },
                );
                Some(Line::First)
            }
            Some(entry) if now >= entry.logged_at + self.every => {
                let failed = entry.quiet + 1;
                entry.logged_at = now;
                entry.quiet = 0;
                Some(Line::Still { failed })
            }
            Some(entry) => {
                entry.quiet += 1;
                None
            }
        }
    }

    /// `subject` works again: whether its failure had been reported.
    pub(crate) fn recovered(&mut self, subject: &str) -> bool {
        self.open.remove(subject).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_then_one_at_recovery() {
        let every = Duration::from_secs(60);
        let mut reports = Reports::new(every);
        let t0 = Instant::now();
        assert_eq!(reports.failed("p0", t0), Some(Line::First));
        let mut lines = 0;
        // A try every 800 ms for ten minutes.
        for i in 1..750u32 {
            if reports
                .failed("p0", t0 + Duration::from_millis(800) * i)
                .is_some()
            {
                lines += 1;
            }
        }
        assert_eq!(lines, 9, "one line a minute");
        assert_eq!(
            reports.failed("p1", t0),
            Some(Line::First),
            "each subject on its own"
        );
        assert!(reports.recovered("p0"));
        assert!(!reports.recovered("p0"));
        assert_eq!(reports.failed("p0", t0), Some(Line::First));
        let mut r = Reports::new(every);
        r.failed("x", t0);
        r.failed("x", t0 + Duration::from_secs(1));
        assert_eq!(r.failed("x", t0 + every), Some(Line::Still { failed: 2 }));
    }
}
