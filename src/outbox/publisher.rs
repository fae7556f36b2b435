//! The outbox publisher: what `run` starts, and how tests and benches build
//! one on other parts. The work itself is the pipeline (`pipeline`).

use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::{
    KafkaTransport,
    pipeline::{Parts, Published, Run, Until},
    store::{PgStore, Store},
    timing::Timing,
    transport::Transport,
};
use crate::{
    clock::{Clock, SystemClock},
    config::{KafkaSettings, PublisherSettings},
    context::TaskContext,
    handoff::{HandedRows, Handoff},
    telemetry::{Health, Metrics},
};

/// Claimed rows one instance holds at most, in requests' worth
/// (`OUTBOX_BATCH_SIZE` rows per request): enough for every partition of a
/// few topics to have one request on the way and the next one waiting,
/// and small in memory (16 × 500 rows of about 1 KB: 8 MB).
const HELD_REQUESTS: usize = 16;

/// Committed batches the expiry may have handed over and the pipeline not
/// yet taken in. The pipeline takes a batch in as soon as it looks (it
/// only routes the rows), so this is slack for a busy moment; a batch that
/// finds it full waits for its lease to end instead.
const HANDOFF_BATCHES: usize = 64;

/// The outbox publisher (see the `pipeline` module).
pub struct Publisher<T = KafkaTransport, S = PgStore> {
    parts: Parts<T, S>,
    /// The receiving end of [`Publisher::handoff`], taken by the run.
    intake: Mutex<Option<mpsc::Receiver<HandedRows>>>,
}

impl<T, S> std::fmt::Debug for Publisher<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("topic", &self.parts.topic)
            .field("timing", &self.parts.timing)
            .field("request_max", &self.parts.request_max)
            .field("max_held", &self.parts.max_held)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// The publisher of `run`: PostgreSQL through `context`'s pool, Kafka
    /// with `kafka`, waiting as `timing` says ([`Timing::new`]).
    pub fn new(
        context: &TaskContext,
        kafka: KafkaSettings,
        settings: &PublisherSettings,
        timing: Timing,
        topic: String,
    ) -> Self {
        let transport = KafkaTransport::new(kafka)
            .with_metadata_refreshes(context.metrics.kafka_metadata_refreshes.clone())
            .with_throttle_metrics(super::kafka::ThrottleMetrics {
                responses: context.metrics.kafka_throttled_responses.clone(),
                seconds: context.metrics.kafka_throttle_seconds.clone(),
            })
            .with_clock(Arc::clone(&context.clock));
        Self::on_database(context, transport, timing, settings, topic)
    }
}

impl<T: Transport> Publisher<T, PgStore> {
    /// A publisher on `context`'s database, sending through `transport`.
    pub fn on_database(
        context: &TaskContext,
        transport: T,
        timing: Timing,
        settings: &PublisherSettings,
        topic: String,
    ) -> Self {
        let store = PgStore::new(
            context.pool.clone(),
            Arc::clone(&context.clock),
            settings.retention.is_zero(),
        );
        Builder::new(transport, store, topic)
            .timing(timing)
            .settings(settings)
            .context(context)
            .build()
    }
}

impl<T: Transport, S: Store> Publisher<T, S> {
    /// Starts building a publisher on any transport and store (tests).
    pub fn builder(transport: T, store: S, topic: impl Into<String>) -> Builder<T, S> {
        Builder::new(transport, store, topic.into())
    }

    pub fn transport(&self) -> &T {
        &self.parts.transport
    }

    pub fn store(&self) -> &S {
        &self.parts.store
    }

    pub fn timing(&self) -> &Timing {
        &self.parts.timing
    }

    /// Where this process's expiry hands the rows it writes leased to this
    /// publisher ([`Handoff`]); the next run takes them in. One handoff per
    /// publisher: a second call replaces the first's intake.
    pub fn handoff(&self) -> Handoff {
        let (sender, receiver) = mpsc::channel(HANDOFF_BATCHES);
        *self.intake.lock().unwrap_or_else(|p| p.into_inner()) = Some(receiver);
        Handoff {
            sender,
            lease: self.parts.timing.lease,
            owner: self.parts.store.owner(),
        }
    }

    fn take_intake(&self) -> Option<mpsc::Receiver<HandedRows>> {
        self.intake.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Publishes until `shutdown`, waking on `wake` (commit notifications)
    /// as well as on its poll tick. At shutdown, requests on the way have
    /// `Timing::stop_wait` to be answered; then the rows still held are
    /// released for another instance and what was acknowledged is marked.
    pub async fn run(&self, wake: Arc<Notify>, shutdown: CancellationToken) -> Published {
        let published = Run::new(&self.parts, self.take_intake())
            .run(&wake, &shutdown, Until::Shutdown)
            .await;
        tracing::info!(
            published = published.published,
            parked = published.parked,
            "outbox publisher stopped"
        );
        published
    }

    /// Publishes until nothing is left to claim, hold or mark (tests,
    /// benches, and a drain before a maintenance window). Rows of a
    /// partition that cannot be written keep it going: bound it with a
    /// timeout.
    pub async fn publish_until_idle(&self) -> Published {
        Run::new(&self.parts, self.take_intake())
            .run(&Notify::new(), &CancellationToken::new(), Until::Idle)
            .await
    }
}

/// Builds a [`Publisher`]; what is not set has its default.
pub struct Builder<T, S> {
    parts: Parts<T, S>,
}

impl<T, S> std::fmt::Debug for Builder<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("topic", &self.parts.topic)
            .finish_non_exhaustive()
    }
}

impl<T: Transport, S: Store> Builder<T, S> {
    fn new(transport: T, store: S, topic: String) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let health = Arc::new(Health::new(clock.now(), false, true));
        let settings = PublisherSettings::default();
        Self {
            parts: Parts {
                transport: Arc::new(transport),
                store: Arc::new(store),
                timing: Timing::default(),
                request_max: settings.batch_size as usize,
                max_held: HELD_REQUESTS * settings.batch_size as usize,
                topic,
                clock,
                metrics: Arc::new(Metrics::new()),
                health,
                seed: None,
            },
        }
    }

    pub fn timing(mut self, timing: Timing) -> Self {
        self.parts.timing = timing;
        self
    }

    /// `OUTBOX_BATCH_SIZE` (records per request and per claim) and the
    /// poll interval.
    pub fn settings(mut self, settings: &PublisherSettings) -> Self {
        let batch = (settings.batch_size as usize).max(1);
        self.parts.request_max = batch;
        self.parts.max_held = HELD_REQUESTS * batch;
        self.parts.timing.poll_interval = settings.poll_interval;
        self
    }

    /// At most `rows` claimed rows held at once.
    pub fn max_held(mut self, rows: usize) -> Self {
        self.parts.max_held = rows.max(1);
        self
    }

    /// The clock, metrics and health of `context`.
    pub fn context(mut self, context: &TaskContext) -> Self {
        self.parts.clock = Arc::clone(&context.clock);
        self.parts.metrics = Arc::clone(&context.metrics);
        self.parts.health = Arc::clone(&context.health);
        self
    }

    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.parts.clock = clock;
        self
    }

    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.parts.metrics = metrics;
        self
    }

    pub fn health(mut self, health: Arc<Health>) -> Self {
        self.parts.health = health;
        self
    }

    /// Backoff jitter from a seeded generator (repeatable tests).
    pub fn seed(mut self, seed: u64) -> Self {
        self.parts.seed = Some(seed);
        self
    }

    pub fn build(self) -> Publisher<T, S> {
        Publisher {
            parts: self.parts,
            intake: Mutex::new(None),
        }
    }
}
