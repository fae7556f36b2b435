//! What the publisher tests share: a publisher on a test database with any
//! transport, filling the outbox through a real expiry cycle, running the
//! publisher until a condition holds, and the outbox's counts.

use std::{sync::Arc, time::Duration};

use booking_expiration::{
    clock::{Clock, SystemClock},
    config::PublisherSettings,
    context::TaskContext,
    outbox::{PgStore, Published, Publisher, Timing, Transport},
    telemetry::{Health, Metrics},
};
use tokio::{sync::Notify, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use super::{TestDb, clock, events_on, expiry_settings, t0, wait_until, wall_now};

/// Publisher settings for tests: `batch_size` rows per request and claim,
/// a 200 ms poll, an hour's retention.
pub fn publisher_settings(batch_size: u32) -> PublisherSettings {
    PublisherSettings {
        batch_size,
        poll_interval: Duration::from_millis(200),
        retention: Duration::from_secs(3600),
    }
}

/// The timing of `run` with these settings and `request_timeout`.
pub fn timing_for(settings: &PublisherSettings, request_timeout: Duration) -> Timing {
    Timing {
        request_timeout,
        poll_interval: settings.poll_interval,
        ..Timing::default()
    }
}

/// A publisher instance on a test database: its context (pool, clock,
/// metrics, health of a publishing instance) and the publisher.
pub struct Rig<T: Transport> {
    pub context: TaskContext,
    pub publisher: Arc<Publisher<T, PgStore>>,
}

impl<T: Transport> Rig<T> {
    /// A publisher on `pool` sending through `transport`, on the wall clock.
    pub fn new(
        pool: booking_expiration::db::PgPool,
        transport: T,
        settings: &PublisherSettings,
        timing: Timing,
        topic: &str,
    ) -> Self {
        Self::with_clock(
            pool,
            transport,
            settings,
            timing,
            topic,
            Arc::new(SystemClock),
        )
    }

    pub fn with_clock(
        pool: booking_expiration::db::PgPool,
        transport: T,
        settings: &PublisherSettings,
        timing: Timing,
        topic: &str,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let context = TaskContext {
            health: Arc::new(Health::new(wall_now(), false, true)),
            ..TaskContext::new(pool, clock)
        };
        let publisher = Arc::new(Publisher::on_database(
            &context,
            transport,
            timing,
            settings,
            topic.to_owned(),
        ));
        Self { context, publisher }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.context.metrics
    }

    pub fn health(&self) -> &Health {
        &self.context.health
    }

    /// Publishes until nothing is left to claim, hold or mark, within `limit`.
    pub async fn publish_until_idle(&self, limit: Duration) -> Published {
        tokio::time::timeout(limit, self.publisher.publish_until_idle())
            .await
            .unwrap_or_else(|_| panic!("the publisher was not idle within {limit:?}"))
    }

    /// Starts `run` (woken by `wake`) until `shutdown`.
    pub fn spawn_run(
        &self,
        wake: Arc<Notify>,
        shutdown: CancellationToken,
    ) -> JoinHandle<Published> {
        let publisher = Arc::clone(&self.publisher);
        tokio::spawn(async move { publisher.run(wake, shutdown).await })
    }

    /// Runs the publisher until `done` holds (within `limit`), then stops
    /// it; returns what it published.
    pub async fn run_until<F, Fut>(&self, what: &str, limit: Duration, done: F) -> Published
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let shutdown = CancellationToken::new();
        let task = self.spawn_run(Arc::new(Notify::new()), shutdown.clone());
        wait_until(what, limit, done).await;
        shutdown.cancel();
        task.await.expect("the publisher does not panic")
    }

    /// `/metrics`' count of produce errors with `code`.
    pub fn produce_errors(&self, code: &str) -> u64 {
        let prefix =
            format!("crm_booking_expiration_outbox_produce_errors_total{{code=\"{code}\"}} ");
        self.metrics()
            .encode()
            .lines()
            .find_map(|line| {
                line.strip_prefix(&prefix)
                    .and_then(|n| n.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

/// Expires `n` seeded due bookings into the outbox of `topic` (one real
/// cycle of the worker).
pub async fn expire_into_outbox(db: &TestDb, n: u64, topic: &str) {
    db.seed_due(n, t0()).await;
    let clock = clock();
    let outcome = db
        .worker_for(&clock, expiry_settings(200), events_on(topic))
        .run_cycle(&CancellationToken::new())
        .await
        .expect("an expiry cycle");
    assert_eq!(outcome.report.expired(), n);
}

impl TestDb {
    pub async fn published(&self) -> i64 {
        self.count(
            "SELECT count(*) AS n FROM booking_expiration_outbox WHERE published_at IS NOT NULL",
        )
        .await
    }

    pub async fn parked(&self) -> i64 {
        self.count(
            "SELECT count(*) AS n FROM booking_expiration_outbox WHERE parked_at IS NOT NULL",
        )
        .await
    }

    /// Rows whose lease runs now.
    pub async fn leased(&self) -> i64 {
        self.count(
            "SELECT count(*) AS n FROM booking_expiration_outbox \
             WHERE published_at IS NULL AND claimed_until > statement_timestamp()",
        )
        .await
    }

    pub async fn outbox_rows(&self) -> i64 {
        self.count("SELECT count(*) AS n FROM booking_expiration_outbox")
            .await
    }

    /// The outbox rows' event records (`booking_expiration_outbox_event`),
    /// and how many of them name an outbox row that carries their event.
    pub async fn event_records(&self) -> (i64, i64) {
        let records = self
            .count("SELECT count(*) AS n FROM booking_expiration_outbox_event")
            .await;
        let matched = self
            .count(
                "SELECT count(*) AS n FROM booking_expiration_outbox_event e \
                   JOIN booking_expiration_outbox o ON o.id = e.outbox_id \
                  WHERE o.event_id = e.event_id \
                    AND o.replay_id IS NOT DISTINCT FROM e.replay_id",
            )
            .await;
        (records, matched)
    }

    /// The outbox's keys, oldest first.
    pub async fn outbox_keys(&self) -> Vec<String> {
        self.names("SELECT message_key AS name FROM booking_expiration_outbox ORDER BY id")
            .await
    }
}

/// A port nothing listens on.
pub fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    listener.local_addr().expect("its address").port()
}

/// A broker that accepts connections and never answers; aborted on drop.
pub struct SilentBroker {
    pub addr: std::net::SocketAddr,
    task: JoinHandle<()>,
}

impl SilentBroker {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("its address");
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        Self { addr, task }
    }
}

impl Drop for SilentBroker {
    fn drop(&mut self) {
        self.task.abort();
    }
}
