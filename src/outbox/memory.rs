//! An in-memory [`Sink`] for tests whose subject is not the broker (claim
//! and mark, lanes, shutdown, backoff): it records what was produced, fails
//! when told to (wholly, after acknowledging part of a call, by leaving
//! given keys pending, or by refusing given keys for good), holds produce
//! calls until released, and counts how many produce calls were in flight
//! at once.

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use tokio::sync::watch;

use super::sink::{Delivery, OutgoingRecord, Produced, Refusal, Sink, SinkError};

/// One record the sink acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducedRecord {
    pub topic: String,
    pub record: OutgoingRecord,
}

/// An in-memory broker. Clones and siblings share one state, as lanes of
/// one publisher share one Kafka cluster.
#[derive(Debug, Clone)]
pub struct MemorySink {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// `true` while produce calls are held (see [`MemorySink::hold`]).
    held: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct State {
    produced: Vec<ProducedRecord>,
    /// When each produce call started, in order.
    produce_started: Vec<Instant>,
    in_flight: usize,
    max_in_flight: usize,
    fail_next: usize,
    failing: bool,
    /// The next call acknowledges only this many records; the rest fail.
    partial_next: Option<usize>,
    /// Records with these keys are refused for good.
    refused_keys: Vec<String>,
    /// Records with these keys are not acknowledged (a partition that
    /// cannot be written): they stay pending.
    unwritable_keys: Vec<String>,
    check_failing: bool,
    checks: usize,
    latency: Duration,
}

impl Default for MemorySink {
    fn default() -> Self {
        Self::new()
    }
}

impl MemorySink {
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                held: watch::Sender::new(false),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock already failed; the
        // state is still worth reading.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every record acknowledged so far, in order.
    pub fn produced(&self) -> Vec<ProducedRecord> {
        self.state().produced.clone()
    }

    /// How many produce calls started (failed ones included).
    pub fn produce_calls(&self) -> usize {
        self.state().produce_started.len()
    }

    /// When each produce call started.
    pub fn produce_started(&self) -> Vec<Instant> {
        self.state().produce_started.clone()
    }

    /// Produce calls running now.
    pub fn in_flight(&self) -> usize {
        self.state().in_flight
    }

    /// The most produce calls that were running at the same time.
    pub fn max_in_flight(&self) -> usize {
        self.state().max_in_flight
    }

    /// How many topic checks were made (failed ones included).
    pub fn checks(&self) -> usize {
        self.state().checks
    }

    /// The next `n` produce calls fail (after any hold and latency).
    pub fn fail_next(&self, n: usize) {
        self.state().fail_next = n;
    }

    /// The next produce call acknowledges its first `acked` records and
    /// fails the rest (a partition that failed while others acknowledged).
    pub fn partial_next(&self, acked: usize) {
        self.state().partial_next = Some(acked);
    }

    /// Records with one of these keys are refused as `MESSAGE_TOO_LARGE`
    /// (a record the broker will never take), from now on.
    pub fn refuse_keys(&self, keys: Vec<String>) {
        self.state().refused_keys = keys;
    }

    /// Records with these keys stay pending (a partition that cannot be
    /// written while the others can) until this is called again.
    pub fn set_unwritable_keys(&self, keys: Vec<String>) {
        self.state().unwritable_keys = keys;
    }

    /// Every produce call fails until `set_failing(false)`.
    pub fn set_failing(&self, failing: bool) {
        self.state().failing = failing;
    }

    /// Every topic check fails until `set_check_failing(false)`.
    pub fn set_check_failing(&self, failing: bool) {
        self.state().check_failing = failing;
    }

    /// Each produce call takes this long, as a broker round trip would.
    pub fn set_latency(&self, latency: Duration) {
        self.state().latency = latency;
    }

    /// Produce calls from now on wait (counted as in flight) until
    /// [`Self::release`].
    pub fn hold(&self) {
        self.shared.held.send_replace(true);
    }

    /// Lets held produce calls go on; they then succeed or fail as told.
    pub fn release(&self) {
        self.shared.held.send_replace(false);
    }
}

/// Counts a produce call out of the in-flight gauge however it ends
/// (cancelled included).
struct InFlight<'a>(&'a MemorySink);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.state().in_flight -= 1;
    }
}

impl Sink for MemorySink {
    async fn produce(&self, topic: &str, records: Vec<OutgoingRecord>) -> Produced {
        let latency = {
            let mut state = self.state();
            state.produce_started.push(Instant::now());
            state.in_flight += 1;
            state.max_in_flight = state.max_in_flight.max(state.in_flight);
            state.latency
        };
        let _in_flight = InFlight(self);
        let mut held = self.shared.held.subscribe();
        // The sender lives in `self.shared`, so the channel cannot close here.
        let _ = held.wait_for(|held| !*held).await;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut state = self.state();
        let n = records.len();
        if state.failing {
            return Produced::failed(n, SinkError::Refused("produce"));
        }
        if state.fail_next > 0 {
            state.fail_next -= 1;
            return Produced::failed(n, SinkError::Refused("produce"));
        }
        let acked = state.partial_next.take().unwrap_or(n);
        let mut produced = Produced::all_acked(n);
        for (index, record) in records.into_iter().enumerate() {
            // Past a partial acknowledgement, or a partition that cannot be
            // written: one failed request, the records pending.
            if index >= acked || state.unwritable_keys.contains(&record.key) {
                produced.deliveries[index] = Delivery::Pending;
                if produced.error.is_none() {
                    produced.error = Some(SinkError::Refused("produce"));
                    produced.error_codes.push("CLIENT_REFUSED".to_owned());
                }
            } else if state.refused_keys.contains(&record.key) {
                produced.deliveries[index] = Delivery::Refused(Refusal {
                    code: "MESSAGE_TOO_LARGE".to_owned(),
                    message: "the in-memory sink refuses this key".to_owned(),
                });
                produced.error_codes.push("MESSAGE_TOO_LARGE".to_owned());
            } else {
                state.produced.push(ProducedRecord {
                    topic: topic.to_owned(),
                    record,
                });
            }
        }
        produced
    }

    async fn check_topic(&self, _topic: &str) -> Result<usize, SinkError> {
        let mut state = self.state();
        state.checks += 1;
        if state.check_failing {
            Err(SinkError::Refused("topic check"))
        } else {
            Ok(1)
        }
    }

    /// Shares this sink's state.
    fn sibling(&self) -> Self {
        self.clone()
    }
}
