//! Exponential backoff with jitter, shared by every retry loop: the
//! publisher's, the commit listener's, the wait for the database at start,
//! the Kafka sink's per-partition retries and a failed expiry cycle's.

use std::time::Duration;

/// Doubles from `initial` up to `max`; each wait is drawn uniformly from
/// half to all of the current step so several instances do not retry in
/// lockstep. The random numbers come from an [`fastrand::Rng`] the caller
/// may give ([`Backoff::with_rng`], a seeded one in tests).
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
    rng: fastrand::Rng,
}

impl Backoff {
    /// A backoff drawing from a randomly seeded generator.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self::with_rng(initial, max, fastrand::Rng::new())
    }

    /// A backoff drawing from `rng`.
    pub fn with_rng(initial: Duration, max: Duration, rng: fastrand::Rng) -> Self {
        Self {
            initial,
            max,
            current: initial,
            rng,
        }
    }

    /// The next wait.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = step / 2;
        half + half.mul_f64(self.rng.f64())
    }

    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<Duration> = (0..8).map(|_| backoff.next_delay()).collect();
        assert!(delays[0] >= Duration::from_millis(50) && delays[0] <= Duration::from_millis(100));
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(1)));
        assert!(delays[7] >= Duration::from_millis(500));
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn the_same_seed_draws_the_same_waits_and_another_seed_others() {
        let waits = |seed: u64| {
            let rng = fastrand::Rng::with_seed(seed);
            let mut backoff =
                Backoff::with_rng(Duration::from_millis(20), Duration::from_millis(500), rng);
            (0..10).map(|_| backoff.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(waits(7), waits(7));
        assert_ne!(waits(7), waits(8));
        for (i, wait) in waits(7).into_iter().enumerate() {
            let step =
                (Duration::from_millis(20) * 2u32.pow(i as u32)).min(Duration::from_millis(500));
            assert!(
                wait >= step / 2 && wait <= step,
                "wait {i}: {wait:?} of step {step:?}"
            );
        }
    }
}
