//! The publisher's pipeline, after the Java producer's: rows are claimed
//! continuously (bounded in flight), routed to their partition's queue,
//! sent when that partition can take them, and marked published as their
//! acknowledgements arrive. One task runs it, waiting on whichever comes
//! first:
//!
//! - a request's answer: its rows leave the queue to be marked, or stay at
//!   its head while the partition backs off on its own;
//! - the database round (at most one at a time, so the publisher uses at
//!   most one connection, and only for a short transaction): marks what was
//!   acknowledged since the last round, parks, renews leases, claims;
//! - a topic's partition count (metadata), read when unknown and every
//!   `Timing::metadata_max_age`;
//! - rows this process's expiry wrote leased to it and handed over after
//!   its commit (no claim needed: they go to their partition's queue, or
//!   are released for any claim when it has no room);
//! - a commit notification or the poll tick (new rows may be waiting);
//! - the earliest pause that ends.
//!
//! Nothing waits for anything it does not depend on: a partition that
//! cannot be written keeps its rows (at most its share of memory, and the
//! claim leaves its other rows in the outbox) and takes nothing from the
//! others; no database transaction is open while a request is on the way.

mod requests;
mod rounds;

use std::{sync::Arc, time::Duration};

use tokio::task::{JoinHandle, JoinSet};
use tokio::{
    sync::{Notify, mpsc},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use super::{
    queues::{Queues, Room},
    report::Reports,
    store::{Round, RoundResult, Store},
    timing::Timing,
    transport::{SendError, Transport},
};
use crate::{
    backoff::Backoff,
    clock::Clock,
    db::DbError,
    handoff::HandedRows,
    telemetry::{Health, Metrics},
};

/// The park reason's code for a row that cannot be turned into a record.
pub const CORRUPT_ROW: &str = "CORRUPT_ROW";

/// What a run of the pipeline did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Published {
    /// Rows the broker acknowledged.
    pub published: u64,
    /// Rows parked (refused for good, or not a record).
    pub parked: u64,
}

/// A request's answer: topic, partition, the request's id, how long it
/// took, the result.
type Answer = (String, i32, u64, Duration, Result<(), SendError>);

/// A database round's end: the round, what it returned, when it started.
type RoundDone = (Round, Result<RoundResult, DbError>, Instant);

/// What the pipeline waits for next.
enum Event {
    Answer(Answer),
    Round(Box<Round>, Result<RoundResult, DbError>, Instant),
    Metadata(String, Result<i32, SendError>),
    Handed(Option<HandedRows>),
    Stop,
    Wake,
    Timer,
}

/// When a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// At shutdown (`run`).
    Shutdown,
    /// When nothing is left to claim or send (tests, benches).
    Idle,
}

/// The parts a run shares with its requests and rounds.
pub(crate) struct Parts<T, S> {
    pub transport: Arc<T>,
    pub store: Arc<S>,
    pub timing: Timing,
    pub request_max: usize,
    pub max_held: usize,
    pub topic: String,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub seed: Option<u64>,
}

/// One run of the pipeline.
pub(crate) struct Run<'a, T, S> {
    parts: &'a Parts<T, S>,
    queues: Queues,
    reports: Reports,
    /// Acknowledged rows not yet marked.
    published: Vec<i64>,
    parked: Vec<(i64, String)>,
    /// Renewals of a round that failed, for the next.
    renew_again: Vec<i64>,
    /// Topics' partition counts read since the last round, to record.
    layouts: Vec<(String, i32)>,
    /// Rows to release with the next round: handed over without room.
    release_next: Vec<i64>,
    /// Rows the expiry of this process hands over (closed: `None`).
    intake: Option<mpsc::Receiver<HandedRows>>,
    /// Rows may be waiting in the outbox: set by what can bring some (a
    /// commit notification, the poll tick, a full claim, a partition the
    /// last claim left out draining), cleared when a claim starts.
    more: bool,
    /// What the last claim left out.
    skipped: Room,
    stopping: Option<Instant>,
    /// The last round (releasing what is held) has started.
    released: bool,
    next_poll: Instant,
    database_retry: Backoff,
    database_ready_at: Instant,
    /// Requests, database rounds and metadata reads run as tasks of their
    /// own: each makes progress whatever the loop is busy with (a round
    /// left unpolled would keep its transaction open); dropping the set
    /// aborts the requests still on the way.
    answers: JoinSet<Answer>,
    round: Option<JoinHandle<RoundDone>>,
    metadata: Option<JoinHandle<(String, Result<i32, SendError>)>>,
    done: Published,
}

impl<'a, T: Transport, S: Store> Run<'a, T, S> {
    pub(crate) fn new(parts: &'a Parts<T, S>, intake: Option<mpsc::Receiver<HandedRows>>) -> Self {
        let timing = parts.timing;
        let mut rng = parts
            .seed
            .map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
        let now = Instant::now();
        let queues = Queues::new(
            &parts.topic,
            timing,
            parts.request_max,
            parts.max_held,
            rng.fork(),
        );
        Self {
            parts,
            queues,
            reports: Reports::new(timing.report_every),
            published: Vec::new(),
            parked: Vec::new(),
            renew_again: Vec::new(),
            layouts: Vec::new(),
            release_next: Vec::new(),
            intake,
            more: true,
            skipped: Room::default(),
            stopping: None,
            released: false,
            next_poll: now + timing.poll_interval,
            database_retry: Backoff::with_rng(
                timing.database_retry_first,
                timing.database_retry_max,
                rng,
            ),
            database_ready_at: now,
            answers: JoinSet::new(),
            round: None,
            metadata: None,
            done: Published::default(),
        }
    }

    /// Runs until `until`; returns what it published.
    pub(crate) async fn run(
        mut self,
        wake: &Notify,
        shutdown: &CancellationToken,
        until: Until,
    ) -> Published {
        loop {
            let now = Instant::now();
            // The round first: the database is the pipeline's critical
            // path, and its task starts while the requests are built.
            self.start_round(now);
            if self.stopping.is_none() {
                self.start_sends(now);
                self.start_metadata(now);
            }
            if self.finished(until, now) {
                break;
            }
            let wake_at = self.wake_at(now);
            let event = tokio::select! {
                biased;
                Some(answer) = self.answers.join_next(), if !self.answers.is_empty() => Event::Answer(joined(answer)),
                (round, result, started) = pending_or(&mut self.round) => Event::Round(Box::new(round), result, started),
                (topic, result) = pending_or(&mut self.metadata) => Event::Metadata(topic, result),
                handed = recv_or_pending(&mut self.intake), if !self.released => Event::Handed(handed),
                () = shutdown.cancelled(), if self.stopping.is_none() => Event::Stop,
                () = wake.notified(), if self.stopping.is_none() => Event::Wake,
                () = tokio::time::sleep_until(wake_at) => Event::Timer,
            };
            let now = Instant::now();
            match event {
                Event::Answer(answer) => self.answered(answer, now),
                Event::Round(round, result, started) => {
                    self.round_done(*round, result, started, now)
                }
                Event::Metadata(topic, result) => self.metadata_done(&topic, result, now),
                Event::Handed(Some(handed)) => self.handed(handed),
                Event::Handed(None) => self.intake = None,
                Event::Stop => self.stopping = Some(now + self.parts.timing.stop_wait),
                Event::Wake => {
                    // A commit notification: rows may have come back
                    // behind the partitions' scans, new ones may wait.
                    self.queues.rows_announced();
                    self.more = true;
                }
                Event::Timer if now >= self.next_poll => {
                    self.more = true;
                    self.next_poll = now + self.parts.timing.poll_interval;
                }
                Event::Timer => {}
            }
            self.update_health();
        }
        self.done
    }

    /// Whether the run is over. Idle: nothing to claim, hold or mark.
    /// Stopping: once every request on the way was answered and the expiry
    /// stopped handing rows over (or `Timing::stop_wait` passed), the rows
    /// still held are released in a last round with the last marks, and the
    /// run ends when that round has (whatever its result: rows it could not
    /// release come back when their lease ends).
    fn finished(&mut self, until: Until, now: Instant) -> bool {
        let quiet = self.round.is_none() && self.answers.is_empty() && self.metadata.is_none();
        if until == Until::Idle
            && quiet
            && self.intake.as_ref().is_none_or(mpsc::Receiver::is_empty)
            && !self.more
            && self.queues.held() == 0
            && self.published.is_empty()
            && self.parked.is_empty()
        {
            return true;
        }
        let Some(stop_at) = self.stopping else {
            return false;
        };
        if self.released {
            return self.round.is_none();
        }
        // Wait (until `stop_at`) for the requests on the way, and for the
        // expiry to stop handing rows over (it drops its end when it has
        // stopped), so its last batch is released with the rest.
        let waiting = !self.answers.is_empty() || self.intake.is_some();
        if (waiting && now < stop_at) || self.round.is_some() {
            return false;
        }
        // Requests still on the way are dropped: their rows go back to the
        // outbox with the others (the broker may have written them).
        self.answers = JoinSet::new();
        if let Some(metadata) = self.metadata.take() {
            metadata.abort();
        }
        let mut release = self.queues.release_all();
        release.append(&mut self.release_next);
        // Rows handed over after `stop_at` go back too.
        if let Some(intake) = &mut self.intake {
            intake.close();
            while let Ok(handed) = intake.try_recv() {
                release.extend(handed.rows.iter().map(|row| row.id));
            }
        }
        self.released = true;
        self.start_round_with(release, now);
        self.round.is_none()
    }

    /// When to look again if nothing arrives: the earliest pause that ends
    /// after `now`. A time already past is left out: what is due then is
    /// waiting for something on the way (a round, a metadata read) whose
    /// end wakes the loop anyway.
    fn wake_at(&self, now: Instant) -> Instant {
        let pauses = [
            (self.stopping.is_none())
                .then(|| self.queues.next_wake())
                .flatten(),
            self.queues.next_renewal(),
            self.stopping,
            Some(self.database_ready_at),
        ];
        pauses
            .into_iter()
            .flatten()
            .filter(|at| *at > now)
            .fold(self.next_poll.max(now), Instant::min)
    }

    fn update_health(&self) {
        let failures = self.queues.failing();
        let failing = failures.failing;
        self.parts
            .health
            .set_partitions_failing(failing, failures.fatal, failures.code);
        let metrics = &self.parts.metrics;
        metrics.outbox_partitions_failing.set(failing as i64);
        metrics.outbox_held.set(self.queues.held() as i64);
    }
}

/// The next rows handed over; pending forever without an intake.
async fn recv_or_pending(intake: &mut Option<mpsc::Receiver<HandedRows>>) -> Option<HandedRows> {
    match intake {
        Some(intake) => intake.recv().await,
        None => std::future::pending().await,
    }
}

/// The output of the task in `slot`, which is then emptied; pending
/// forever while the slot is empty.
async fn pending_or<T>(slot: &mut Option<JoinHandle<T>>) -> T {
    match slot {
        Some(task) => {
            let output = joined(task.await);
            *slot = None;
            output
        }
        None => std::future::pending().await,
    }
}

/// A task's output; its panic goes on in the pipeline's task (a bug, not a
/// fault to carry on from). The pipeline aborts only tasks it no longer
/// awaits.
fn joined<T>(result: Result<T, tokio::task::JoinError>) -> T {
    match result {
        Ok(output) => output,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(error) => panic!("a pipeline task ended without its result: {error}"),
    }
}
