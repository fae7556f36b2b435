//! The commands, wired from settings to running tasks. `main` only parses
//! the command line, installs logging and maps errors to exit codes.

mod republish;
mod status;
mod tasks;

use std::{sync::Arc, time::Duration};

use diesel_async::AsyncConnection;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use republish::{RepublishReport, RepublishRequest, RepublishedEvent, republish};
pub use status::{PhaseStatus, PoisonRow, StatusReport, status};
pub use tasks::{TaskEnded, Tasks};

use crate::{
    backoff::Backoff,
    clock::{Clock, SystemClock},
    config::{
        ConfigError, DatabaseSettings, EventSettings, ExpirySettings, SeedSettings, Settings,
        ShutdownSettings, StartupChecks,
    },
    context::TaskContext,
    db::{self, DbError, privileges::Use},
    expiry::{CycleError, CycleReport, ExpiryWorker, scheduler},
    libpq::PasswordSource,
    outbox::{self, LagStats, Publisher, RetentionSweep},
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
    /// A task of `run` ended while the process ran (a defect): the others
    /// were stopped.
    #[error(transparent)]
    TaskEnded(#[from] TaskEnded),
    /// `republish` stopped between batches (a signal); `resume` is the
    /// whole command that continues it ([`RepublishRequest::resume_command`]).
    #[error("republish stopped before the end: resume with {resume}")]
    ReplayStopped { resume: String },
}

impl AppError {
    /// Exit status: 2 for bad configuration, 3 for pending migrations
    /// (`migrate --check`), 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            AppError::Config(_) => 2,
            AppError::MigrationsPending(_) => 3,
            // EX_SOFTWARE: an internal failure, not the environment's.
            AppError::TaskEnded(_) => 70,
            _ => 1,
        }
    }
}

/// The start-up checks of the database settings that need the TLS library
/// (the CPU, the certificate and key files), made before anything
/// connects: `database`, or the line of an exit 2.
pub fn checked_database(database: DatabaseSettings) -> Result<DatabaseSettings, ConfigError> {
    check_database(&database)?;
    Ok(database)
}

/// What `run`'s settings are checked with at start (config cannot check
/// what needs the TLS library itself).
pub const STARTUP_CHECKS: StartupChecks = StartupChecks {
    database: check_database,
    kafka: outbox::kafka::security::check,
};

fn check_database(database: &DatabaseSettings) -> Result<(), ConfigError> {
    let setting = if database.is_direct {
        "DATABASE_DIRECT_URL"
    } else {
        "DATABASE_URL"
    };
    db::tls::check(setting, &database.url)?;
    if let Some(direct) = &database.direct_url {
        db::tls::check("DATABASE_DIRECT_URL", direct)?;
    }
    Ok(())
}

/// Says which database a command connects to and where its password comes
/// from (`url`, `PGPASSWORD`, `passfile PATH` or `none`; never the
/// password), and warns about a password file that is ignored (named with
/// its mode, never its content). Every command that connects says it
/// first; `run` in its start-up line.
pub fn announce_database(database: &DatabaseSettings) {
    tracing::info!(
        database = %database.url.redacted(),
        hosts = %database.url.targets(),
        password = %database.url.password_source(),
        "connecting to PostgreSQL"
    );
    warn_ignored_passfile(database);
}

/// The warning of a password file that is ignored, for each URL.
fn warn_ignored_passfile(database: &DatabaseSettings) {
    for url in std::iter::once(&database.url).chain(database.direct_url.as_ref()) {
        if let PasswordSource::None {
            problem: Some(problem),
            ..
        } = url.password_source()
        {
            tracing::warn!("{problem}");
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
    db::privileges::check_pooled(&pool, &[Use::Expire]).await?;
    let context = TaskContext::new(pool, Arc::new(SystemClock));
    let worker = ExpiryWorker::new(&context, expiry, events, shutdown_settings);
    Ok(worker.run_cycle(&shutdown).await?.report)
}

/// Waits for the database at start: in an orchestrated deployment it may
/// come up after the worker. Every failed attempt is logged with its reason.
/// A stop signal ends the wait at once (`false`), whatever an attempt in
/// flight still waits for: a database that accepts and never answers holds
/// one for up to `DATABASE_CONNECT_TIMEOUT`, past an orchestrator's grace.
async fn wait_for_database(
    settings: &DatabaseSettings,
    shutdown: &CancellationToken,
) -> Result<bool, AppError> {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(15));
    loop {
        let attempt = tokio::select! {
            _ = shutdown.cancelled() => return Ok(false),
            attempt = db::probe(settings) => attempt,
        };
        match attempt {
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
    let context = TaskContext {
        pool: db::build_pool(&db_settings),
        health: Arc::new(Health::new(clock.now(), roles.worker, roles.publisher)),
        metrics: Arc::new(Metrics::new()),
        clock,
    };
    let pool = &context.pool;
    let listener = http::bind(metrics_addr).await?;
    tracing::info!(
        %metrics_addr,
        database = %db_settings.url.redacted(),
        hosts = %db_settings.url.targets(),
        password = %db_settings.url.password_source(),
        pooler = %db_settings.pooler,
        "starting"
    );
    warn_ignored_passfile(&db_settings);
    if !db_settings.pooler.keeps_sessions() {
        tracing::info!(
            "DATABASE_POOLER=transaction: no prepared statement outlives its transaction and no \
             session setting is sent; statement_timeout, lock_timeout and \
             idle_in_transaction_session_timeout come from the database role"
        );
    }
    let mut tasks = Tasks::default();
    tasks.spawn(
        "http",
        http::serve(
            listener,
            http::HttpState {
                clock: Arc::clone(&context.clock),
                metrics: Arc::clone(&context.metrics),
                health: Arc::clone(&context.health),
                database: {
                    let pool = pool.clone();
                    Arc::new(move || {
                        let pool = pool.clone();
                        Box::pin(async move { db::ping(&pool).await })
                    })
                },
                liveness_window: http_settings.liveness_window,
            },
            shutdown.clone(),
        ),
    );

    let uses: Vec<Use> = [
        (roles.worker, Use::Expire),
        (roles.worker, Use::Wake),
        (roles.publisher, Use::Publish),
        (true, Use::Lag),
    ]
    .into_iter()
    .filter_map(|(on, used)| on.then_some(used))
    .collect();
    // A stop signal during start-up stops it at once: nothing runs yet, so
    // there is nothing to finish, and the exit is 0 as for any requested
    // stop.
    let started = wait_for_database(&db_settings, &shutdown).await?
        && tokio::select! {
            _ = shutdown.cancelled() => false,
            checked = db::privileges::check_pooled(pool, &uses) => { checked?; true }
        };
    if !started {
        tracing::info!("stop requested while starting: stopped during start-up, before any work");
    }
    // The publisher is built before the expiry starts, so the expiry can
    // write its outbox rows leased to it (`handoff::Handoff`).
    let mut handoff = None;
    if !shutdown.is_cancelled() {
        // The outbox lag gauges on every instance, publisher or not: an
        // instance that only expires still shows how far publishing lags.
        tasks.spawn("lag stats", LagStats::new(&context).run(shutdown.clone()));
    }
    if let Some(kafka_settings) = kafka_settings
        && !shutdown.is_cancelled()
    {
        let wake = Arc::new(Notify::new());
        // The commit wake-up LISTENs on a session of its own: DATABASE_URL,
        // or DATABASE_DIRECT_URL past a pooler. A transaction pooler keeps
        // no session, so without a direct URL the publisher only polls.
        match db_settings.session() {
            Some(session) => {
                tasks.spawn(
                    "commit listener",
                    outbox::listen_for_commits(session, Arc::clone(&wake), shutdown.clone()),
                );
            }
            None => tracing::info!(
                poll_interval_ms = publisher_settings.poll_interval.as_millis() as u64,
                "no commit wake-up: LISTEN needs a session, which DATABASE_POOLER=transaction \
                 does not keep and DATABASE_DIRECT_URL is not set; the publisher polls the \
                 outbox every OUTBOX_POLL_INTERVAL"
            ),
        }
        let retention = publisher_settings.retention;
        let timing = outbox::Timing::new(
            &kafka_settings,
            &publisher_settings,
            shutdown_settings.grace,
        );
        let publisher = Publisher::new(
            &context,
            kafka_settings,
            &publisher_settings,
            timing,
            events.topic.clone(),
        );
        if roles.worker {
            handoff = Some(publisher.handoff());
        }
        // Two tasks, each with its own schedule: the publisher's pipeline
        // (its metadata reads are the broker's readiness check) and
        // retention.
        let stop = shutdown.clone();
        tasks.spawn("publisher", async move {
            publisher.run(wake, stop).await;
        });
        if !retention.is_zero() {
            tasks.spawn(
                "retention",
                RetentionSweep::new(&context, retention).run(shutdown.clone()),
            );
        }
    }
    if roles.worker && !shutdown.is_cancelled() {
        let worker =
            ExpiryWorker::new(&context, expiry_settings, events.clone(), shutdown_settings);
        let worker = match handoff.take() {
            Some(handoff) => worker.hand_off(handoff),
            None => worker,
        };
        tasks.spawn(
            "expiry",
            scheduler::run(Arc::new(worker), context.clone(), shutdown.clone()),
        );
    }
    // A handoff no expiry took closes now: at shutdown the publisher waits
    // for the expiry's end of it to close.
    drop(handoff);

    // Until a signal, or a task that ends on its own (a defect).
    let ended = tasks.watch(&shutdown).await;
    tracing::info!(grace_ms = grace.as_millis() as u64, "stopping");
    if tokio::time::timeout(grace, tasks.join_all()).await.is_err() {
        tracing::warn!("tasks did not stop within the grace period; aborting them");
        tasks.abort_all();
    }
    tracing::info!("stopped");
    match ended {
        Some(ended) => Err(ended.into()),
        None => Ok(()),
    }
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

/// `outbox retry`: puts parked outbox rows back for the publisher; returns
/// how many rows it put back.
pub async fn outbox_retry(
    database: &DatabaseSettings,
    which: &db::outbox::Unpark,
) -> Result<usize, AppError> {
    let mut conn = db::establish(database).await?;
    db::privileges::check(&mut conn, &[Use::Unpark]).await?;
    let put_back = conn
        .transaction(async |conn| db::outbox::unpark(conn, which).await)
        .await?;
    tracing::info!(put_back, "parked outbox rows put back");
    Ok(put_back)
}

/// `seed`: inserts synthetic bookings relative to `clock`'s now.
pub async fn seed(
    database: &DatabaseSettings,
    plan: &SeedSettings,
    clock: &dyn Clock,
) -> Result<u64, AppError> {
    let mut conn = db::establish(database).await?;
    let plan = db::seed::SeedPlan {
        active: plan.active,
        due_fraction: plan.due_fraction,
        inactive: plan.inactive,
        poison: plan.poison,
        as_of: clock.now(),
        spread: plan.spread,
    };
    let inserted = conn
        .transaction(async |conn| db::seed::seed(conn, &plan).await)
        .await?;
    tracing::info!(inserted, "bookings seeded");
    Ok(inserted)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::{KafkaSettings, KafkaTls};

    /// `run` reads the Kafka TLS files at start, right after parsing
    /// (config takes the paths as they are): a missing CA file is the line
    /// of an exit 2 naming its setting.
    #[test]
    fn the_start_up_check_reads_the_kafka_tls_files() {
        if !crate::tls::cpu_supported() {
            // No TLS on this CPU at all: its own start-up error, tested where it is made.
            return;
        }
        let settings = KafkaSettings {
            tls: Some(KafkaTls {
                ca: Some(PathBuf::from("/nonexistent/ca.pem")),
                client: None,
            }),
            ..KafkaSettings::new(vec!["h:9092".into()])
        };
        let error = (STARTUP_CHECKS.kafka)(&settings).unwrap_err();
        assert_eq!(error.setting, "KAFKA_SSL_CA_LOCATION");
        assert!(error.problem.contains("cannot read"), "{error}");
    }
}
