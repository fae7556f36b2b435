//! The commands, wired from settings to running tasks. `main` only parses
//! the command line, installs logging and maps errors to exit codes.

use std::{sync::Arc, time::Duration};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{
    clock::{Clock, SystemClock},
    config::{
        ConfigError, DatabaseSettings, EventSettings, ExpirySettings, SeedSettings, Settings,
        ShutdownSettings,
    },
    db::{self, DbError},
    expiry::{CycleError, CycleReport, ExpiryWorker, scheduler},
    outbox::{self, KafkaSink, LagStats, Publisher, RetentionSweep},
    telemetry::{ErrorChain, Health, Metrics, http},
};

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("invalid configuration")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Database(#[from] DbError),
    #[error(transparent)]
    Http(#[from] http::HttpError),
    #[error("expiry cycle failed")]
    Cycle(#[from] CycleError),
    /// `migrate --check` found migrations to apply.
    #[error("{0} migration(s) pending: run `booking-expiration migrate`")]
    MigrationsPending(usize),
}

impl AppError {
    /// Exit status: 2 for bad configuration, 3 for pending migrations
    /// (`migrate --check`), 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            AppError::Config(_) => 2,
            AppError::MigrationsPending(_) => 3,
            _ => 1,
        }
    }
}

/// `migrate`: applies pending migrations.
pub async fn migrate(database: &DatabaseSettings) -> Result<Vec<String>, AppError> {
    let applied = db::migrate::run_migrations(database).await?;
    if applied.is_empty() {
        tracing::info!("schema is up to date");
    } else {
        tracing::info!(applied = ?applied, "migrations applied");
    }
    Ok(applied)
}

/// `migrate --check`: the embedded migrations not yet applied, oldest
/// first. Reads only.
pub async fn pending_migrations(database: &DatabaseSettings) -> Result<Vec<String>, AppError> {
    Ok(db::migrate::pending_migrations(database).await?)
}

/// `once`: one cycle, no publishing.
pub async fn once(
    database: &DatabaseSettings,
    expiry: ExpirySettings,
    events: EventSettings,
    shutdown_settings: ShutdownSettings,
    shutdown: CancellationToken,
) -> Result<CycleReport, AppError> {
    let pool = db::connect_pool(database).await?;
    let worker = ExpiryWorker::new(
        pool,
        Arc::new(SystemClock),
        expiry,
        events,
        shutdown_settings,
        Arc::new(Metrics::new()),
    );
    Ok(worker.run_cycle(&shutdown).await?.report)
}

/// Waits for the database at start: in an orchestrated deployment it may
/// come up after the worker. Every failed attempt is logged with its reason.
async fn wait_for_database(
    settings: &DatabaseSettings,
    shutdown: &CancellationToken,
) -> Result<bool, AppError> {
    let mut backoff = outbox::Backoff::new(Duration::from_millis(500), Duration::from_secs(15));
    loop {
        match db::probe(settings).await {
            Ok(()) => return Ok(true),
            Err(error) => {
                let delay = backoff.next_delay();
                tracing::error!(error = %ErrorChain(&error), retry_in_ms = delay.as_millis() as u64, "database not reachable at start");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(false),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// `run`: worker + publisher + HTTP until `shutdown`, then a graceful stop.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> Result<(), AppError> {
    let grace = settings.stop_grace();
    let Settings {
        database: db_settings,
        expiry: expiry_settings,
        events,
        publisher: publisher_settings,
        kafka: kafka_settings,
        http: http_settings,
        shutdown: shutdown_settings,
        roles,
    } = settings;
    let metrics_addr = http_settings.metrics_addr;

    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::new(clock.now(), roles.worker, roles.publisher));
    let pool = db::build_pool(&db_settings);
    let listener = http::bind(metrics_addr).await?;
    tracing::info!(%metrics_addr, database = %db_settings.url.redacted(), "starting");
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(http::serve(
        listener,
        http::HttpState {
            clock: Arc::clone(&clock),
            metrics: Arc::clone(&metrics),
            health: Arc::clone(&health),
            pool: pool.clone(),
            liveness_window: http_settings.liveness_window,
        },
        shutdown.clone(),
    ));

    if !wait_for_database(&db_settings, &shutdown).await? {
        shutdown.cancel();
    }
    if roles.worker && !shutdown.is_cancelled() {
        let worker = Arc::new(ExpiryWorker::new(
            pool.clone(),
            Arc::clone(&clock),
            expiry_settings,
            events.clone(),
            shutdown_settings,
            Arc::clone(&metrics),
        ));
        tasks.spawn(scheduler::run(
            worker,
            Arc::clone(&clock),
            Arc::clone(&metrics),
            Arc::clone(&health),
            shutdown.clone(),
        ));
    }
    if !shutdown.is_cancelled() {
        // The outbox lag gauges on every instance, publisher or not: an
        // instance that only expires still shows how far publishing lags.
        tasks.spawn(
            LagStats::new(pool.clone(), Arc::clone(&clock), Arc::clone(&metrics))
                .run(shutdown.clone()),
        );
    }
    if let Some(kafka_settings) = kafka_settings
        && !shutdown.is_cancelled()
    {
        let wake = Arc::new(Notify::new());
        tasks.spawn(outbox::listen_for_commits(
            db_settings.clone(),
            Arc::clone(&wake),
            shutdown.clone(),
        ));
        let retention = publisher_settings.retention;
        let publisher = Publisher::new(
            pool.clone(),
            KafkaSink::new(kafka_settings)
                .with_metadata_refreshes(metrics.kafka_metadata_refreshes.clone()),
            Arc::clone(&clock),
            publisher_settings,
            Arc::clone(&metrics),
            Arc::clone(&health),
            events.topic.clone(),
        );
        // Three tasks, each with its own schedule: publishing (wake-up,
        // backoff), the broker readiness check, retention.
        let (p, stop) = (publisher.clone(), shutdown.clone());
        tasks.spawn(async move { p.run(wake, stop).await });
        let stop = shutdown.clone();
        tasks.spawn(async move { publisher.run_broker_check(stop).await });
        if !retention.is_zero() {
            tasks.spawn(
                RetentionSweep::new(
                    pool.clone(),
                    Arc::clone(&clock),
                    retention,
                    Arc::clone(&metrics),
                )
                .run(shutdown.clone()),
            );
        }
    }

    shutdown.cancelled().await;
    tracing::info!(grace_ms = grace.as_millis() as u64, "stopping");
    let drained = tokio::time::timeout(grace, async {
        while let Some(result) = tasks.join_next().await {
            if let Err(error) = result {
                tracing::error!(%error, "task ended abnormally");
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!("tasks did not stop within the grace period; aborting them");
        tasks.abort_all();
    }
    tracing::info!("stopped");
    Ok(())
}

/// Cancels `token` on SIGTERM or SIGINT.
pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let terminate = async {
            #[cfg(unix)]
            {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut signal) => {
                        signal.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            }
            #[cfg(not(unix))]
            std::future::pending::<()>().await
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
            _ = terminate => tracing::info!("SIGTERM received"),
        }
        token.cancel();
    });
}

/// What `status` reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StatusReport {
    pub as_of: chrono::DateTime<chrono::Utc>,
    pub phases: Vec<PhaseStatus>,
    pub outbox_unpublished: i64,
    pub outbox_oldest_unpublished_at: Option<chrono::DateTime<chrono::Utc>>,
    pub outbox_oldest_unpublished_age_seconds: i64,
    /// Due rows the domain refuses (first 100 per phase).
    pub poison: Vec<PoisonRow>,
    /// Outbox rows parked because the broker refused them for good.
    pub outbox_parked: i64,
    /// The first 100 parked rows, oldest first.
    pub parked: Vec<db::outbox::ParkedRow>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct PhaseStatus {
    pub phase: &'static str,
    pub backlog: i64,
    pub oldest_due_deadline: Option<chrono::DateTime<chrono::Utc>>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct PoisonRow {
    pub booking_id: uuid::Uuid,
    pub tenant_id: uuid::Uuid,
    pub phase: &'static str,
    pub status: String,
    pub deadline: Option<chrono::DateTime<chrono::Utc>>,
    pub reason: String,
}

/// `status`: reads only; takes no locks that the worker would skip.
pub async fn status(database: &DatabaseSettings) -> Result<StatusReport, AppError> {
    use crate::{db::bookings, domain::Phase};
    let mut conn = db::establish(database).await?;
    let as_of = SystemClock.now();
    let mut phases = Vec::new();
    let mut poison = Vec::new();
    for phase in Phase::ALL {
        phases.push(PhaseStatus {
            phase: phase.as_str(),
            backlog: bookings::count_due(&mut conn, phase, as_of).await?,
            oldest_due_deadline: bookings::oldest_due_deadline(&mut conn, phase, as_of).await?,
        });
        for row in bookings::due_poison_rows(&mut conn, phase, as_of, 100).await? {
            let reason = match row.to_domain() {
                Ok(booking) => booking
                    .expire(as_of)
                    .err()
                    .map_or_else(|| "none".to_owned(), |e| e.to_string()),
                Err(e) => e.to_string(),
            };
            poison.push(PoisonRow {
                booking_id: row.id,
                tenant_id: row.tenant_id,
                phase: phase.as_str(),
                status: row.status.clone(),
                deadline: row.deadline(phase),
                reason,
            });
        }
    }
    let outbox = db::outbox::stats(&mut conn).await?;
    let parked = db::outbox::parked_rows(&mut conn, 100).await?;
    Ok(StatusReport {
        as_of,
        phases,
        outbox_unpublished: outbox.unpublished,
        outbox_oldest_unpublished_at: outbox.oldest_unpublished_at,
        outbox_oldest_unpublished_age_seconds: outbox
            .oldest_unpublished_at
            .map_or(0, |t| (as_of - t).num_seconds().max(0)),
        poison,
        outbox_parked: outbox.parked,
        parked,
    })
}

impl std::fmt::Display for StatusReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
            t.map_or_else(
                || "-".to_owned(),
                |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            )
        };
        writeln!(f, "as of {}", time(Some(self.as_of)))?;
        writeln!(f, "{:<10} {:>10}  oldest due deadline", "phase", "backlog")?;
        for p in &self.phases {
            writeln!(
                f,
                "{:<10} {:>10}  {}",
                p.phase,
                p.backlog,
                time(p.oldest_due_deadline)
            )?;
        }
        writeln!(
            f,
            "outbox     {:>10}  unpublished, oldest {} ({} s)",
            self.outbox_unpublished,
            time(self.outbox_oldest_unpublished_at),
            self.outbox_oldest_unpublished_age_seconds
        )?;
        writeln!(f, "poison rows: {}", self.poison.len())?;
        for p in &self.poison {
            writeln!(
                f,
                "  {} tenant {} {} {} deadline {}: {}",
                p.booking_id,
                p.tenant_id,
                p.phase,
                p.status,
                time(p.deadline),
                p.reason
            )?;
        }
        writeln!(f, "parked outbox rows: {}", self.outbox_parked)?;
        for p in &self.parked {
            writeln!(
                f,
                "  event {} booking {} parked {}: {}",
                p.event_id,
                p.message_key,
                time(Some(p.parked_at)),
                p.reason
            )?;
        }
        Ok(())
    }
}

/// `outbox retry`: puts parked outbox rows back for the publisher; returns
/// how many rows it put back.
pub async fn outbox_retry(
    database: &DatabaseSettings,
    which: &db::outbox::Unpark,
) -> Result<usize, AppError> {
    let mut conn = db::establish(database).await?;
    let put_back = db::outbox::unpark(&mut conn, which).await?;
    tracing::info!(put_back, "parked outbox rows put back");
    Ok(put_back)
}

/// `seed`: inserts synthetic bookings relative to now.
pub async fn seed(database: &DatabaseSettings, plan: &SeedSettings) -> Result<u64, AppError> {
    let mut conn = db::establish(database).await?;
    let inserted = db::seed::seed(
        &mut conn,
        &db::seed::SeedPlan {
            active: plan.active,
            due_fraction: plan.due_fraction,
            inactive: plan.inactive,
            poison: plan.poison,
            as_of: SystemClock.now(),
            spread: plan.spread,
        },
    )
    .await?;
    tracing::info!(inserted, "bookings seeded");
    Ok(inserted)
}
