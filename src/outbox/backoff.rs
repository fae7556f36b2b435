//! Exponential backoff with full jitter for the publisher's retries.

use std::time::Duration;

/// Doubles from `initial` up to `max`; each wait is drawn uniformly from
/// half to all of the current step so several publishers do not retry in
/// lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            current: initial,
        }
    }

    /// The next wait.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = step / 2;
        half + half.mul_f64(fastrand::f64())
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
}
