//! The commands, wired from settings to running tasks. `main` only parses
//! the command line, installs logging and maps errors to exit codes.

use std::{sync::Arc, time::Duration};

use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{
    clock::{Clock, SystemClock},
    config::{
        ConfigError, DatabaseSettings, EventSettings, ExpirySettings, SeedSettings, Settings,
        ShutdownSettings,
    },
    db::{self, DbError, privileges::Use},
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
            _ => 1,
        }
    }
}

/// The start-up checks of the database settings that need the TLS library
/// (the CPU, the certificate and key files), made before anything
/// connects: `database`, or the line of an exit 2.
pub fn checked_database(database: DatabaseSettings) -> Result<DatabaseSettings, ConfigError> {
    let setting = if database.is_direct {
        "DATABASE_DIRECT_URL"
    } else {
        "DATABASE_URL"
    };
    db::tls::check(setting, &database.url)?;
    if let Some(direct) = &database.direct_url {
        db::tls::check("DATABASE_DIRECT_URL", direct)?;
    }
    Ok(database)
}

/// [`checked_database`] and the Kafka TLS check, for `run`.
pub fn checked_settings(settings: Settings) -> Result<Settings, ConfigError> {
    let database = checked_database(settings.database)?;
    if let Some(kafka) = &settings.kafka {
        outbox::kafka_tls::check(kafka)?;
    }
    Ok(Settings {
        database,
        ..settings
    })
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
    tracing::info!(%metrics_addr, database = %db_settings.url.redacted(), pooler = %db_settings.pooler, "starting");
    if db_settings.pooler == crate::config::Pooler::Transaction {
        tracing::info!(
            "DATABASE_POOLER=transaction: no prepared statement outlives its transaction and no \
             session setting is sent; statement_timeout, lock_timeout and \
             idle_in_transaction_session_timeout come from the database role"
        );
    }
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(http::serve(
        listener,
        http::HttpState {
            clock: Arc::clone(&clock),
            metrics: Arc::clone(&metrics),
            health: Arc::clone(&health),
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
    ));

    if !wait_for_database(&db_settings, &shutdown).await? {
        shutdown.cancel();
    } else {
        let uses: Vec<Use> = [
            (roles.worker, Use::Expire),
            (roles.publisher, Use::Publish),
            (true, Use::Lag),
        ]
        .into_iter()
        .filter_map(|(on, used)| on.then_some(used))
        .collect();
        db::privileges::check_pooled(&pool, &uses).await?;
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
        // The commit wake-up LISTENs on a session of its own: DATABASE_URL,
        // or DATABASE_DIRECT_URL past a pooler. A transaction pooler keeps
        // no session, so without a direct URL the publisher only polls.
        match db_settings.session() {
            Some(session) => {
                tasks.spawn(outbox::listen_for_commits(
                    session,
                    Arc::clone(&wake),
                    shutdown.clone(),
                ));
            }
            None => tracing::info!(
                poll_interval_ms = publisher_settings.poll_interval.as_millis() as u64,
                "no commit wake-up: LISTEN needs a session, which DATABASE_POOLER=transaction \
                 does not keep and DATABASE_DIRECT_URL is not set; the publisher polls the \
                 outbox every OUTBOX_POLL_INTERVAL"
            ),
        }
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
    db::privileges::check(&mut conn, &[Use::Status]).await?;
    let as_of = SystemClock.now();
    // One read-only transaction: one snapshot, and through a transaction
    // pooler one server connection for all of it (see `db`).
    let report = conn
        .transaction(async |conn| {
            conn.batch_execute("SET TRANSACTION READ ONLY").await?;
            let mut phases = Vec::new();
            let mut poison = Vec::new();
            for phase in Phase::ALL {
                phases.push(PhaseStatus {
                    phase: phase.as_str(),
                    backlog: bookings::count_due(conn, phase, as_of).await?,
                    oldest_due_deadline: bookings::oldest_due_deadline(conn, phase, as_of).await?,
                });
                for row in bookings::due_poison_rows(conn, phase, as_of, 100).await? {
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
            let outbox = db::outbox::stats(conn).await?;
            let parked = db::outbox::parked_rows(conn, 100).await?;
            Ok::<_, DbError>(StatusReport {
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
        })
        .await?;
    Ok(report)
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
    db::privileges::check(&mut conn, &[Use::Unpark]).await?;
    let put_back = conn
        .transaction(async |conn| db::outbox::unpark(conn, which).await)
        .await?;
    tracing::info!(put_back, "parked outbox rows put back");
    Ok(put_back)
}

/// `seed`: inserts synthetic bookings relative to now.
pub async fn seed(database: &DatabaseSettings, plan: &SeedSettings) -> Result<u64, AppError> {
    let mut conn = db::establish(database).await?;
    let plan = db::seed::SeedPlan {
        active: plan.active,
        due_fraction: plan.due_fraction,
        inactive: plan.inactive,
        poison: plan.poison,
        as_of: SystemClock.now(),
        spread: plan.spread,
    };
    let inserted = conn
        .transaction(async |conn| db::seed::seed(conn, &plan).await)
        .await?;
    tracing::info!(inserted, "bookings seeded");
    Ok(inserted)
}

/// What `republish` is asked to do.
#[derive(Debug, Clone)]
pub struct RepublishRequest {
    pub selection: db::replay::Selection,
    /// Print the events instead of enqueuing them.
    pub dry_run: bool,
    /// Records per transaction.
    pub batch_size: u32,
    /// Resume cursor: start after this audit record id.
    pub after: i64,
    /// The replay the rows belong to (a new one when `None`).
    pub replay_id: Option<uuid::Uuid>,
}

impl RepublishRequest {
    /// The command line that resumes this request after `after` as replay
    /// `replay_id`: the selection, the batch size, `--dry-run`, the topic
    /// and `ce_source` when they are not the defaults, and the cursor. The
    /// database settings come from the environment, as for the first run.
    pub fn resume_command(
        &self,
        events: &EventSettings,
        after: i64,
        replay_id: uuid::Uuid,
    ) -> String {
        let selection = &self.selection;
        let mut words = vec!["booking-expiration".to_owned(), "republish".to_owned()];
        let mut flag = |name: &str, value: String| {
            words.push(name.to_owned());
            words.push(shell_word(&value));
        };
        for id in &selection.booking_ids {
            flag("--booking-id", id.to_string());
        }
        for id in &selection.tenant_ids {
            flag("--tenant", id.to_string());
        }
        if let Some(from) = &selection.expired_from {
            flag("--expired-from", rfc3339(from));
        }
        if let Some(to) = &selection.expired_to {
            flag("--expired-to", rfc3339(to));
        }
        flag("--batch-size", self.batch_size.to_string());
        let defaults = EventSettings::default();
        if events.topic != defaults.topic {
            flag("--kafka-topic", events.topic.clone());
        }
        if events.ce_source != defaults.ce_source {
            flag("--ce-source", events.ce_source.clone());
        }
        flag("--replay-id", replay_id.to_string());
        flag("--after", after.to_string());
        if self.dry_run {
            words.push("--dry-run".to_owned());
        }
        words.join(" ")
    }
}

/// A time as `--expired-from`/`--expired-to` take it, to the precision it has.
fn rfc3339(time: &chrono::DateTime<chrono::Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// `value` as one word for a POSIX shell: as it is when it holds only
/// characters no shell treats specially, else in single quotes.
fn shell_word(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c));
    if plain {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', "'\\''"))
    }
}

/// Progress and result of `republish`: printed on stderr after every batch
/// and on stdout at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RepublishReport {
    pub replay_id: uuid::Uuid,
    pub dry_run: bool,
    pub batches: u64,
    /// Expiry records read.
    pub selected: u64,
    /// Outbox rows written (dry run: events printed).
    pub enqueued: u64,
    /// Events with a row still waiting to be sent, or already enqueued by this replay.
    pub skipped_pending: u64,
    /// Records whose event cannot be rebuilt (logged with the reason).
    pub unrebuildable: u64,
    /// The resume cursor: the last audit record id done (`--after`).
    pub after: i64,
    /// Every selected record was done (false: stopped, resume with `after`).
    pub complete: bool,
}

/// One event as `republish --dry-run` prints it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RepublishedEvent {
    pub audit_id: i64,
    pub topic: String,
    pub key: String,
    pub event_id: uuid::Uuid,
    pub headers: std::collections::BTreeMap<&'static str, String>,
    /// The record value (protobuf), hex.
    pub value_hex: String,
}

/// `republish`: re-enqueues the events of expired bookings, rebuilt from
/// the audit trail and the bookings with the cycle's own builder, one
/// transaction per batch; reads bookings only. Stops between batches on
/// `shutdown` (`complete: false`).
pub async fn republish(
    database: &DatabaseSettings,
    events: &EventSettings,
    request: &RepublishRequest,
    shutdown: CancellationToken,
    mut on_event: impl FnMut(&RepublishedEvent),
    mut on_batch: impl FnMut(&RepublishReport),
) -> Result<RepublishReport, AppError> {
    use tracing::Instrument as _;

    use crate::{db::replay, domain::RunId, events::outbox_message, telemetry::trace};
    use diesel_async::AsyncConnection as _;

    if !request.selection.is_restricted() {
        return Err(AppError::Config(ConfigError::new(
            "republish",
            "name what to replay: --booking-id, --tenant, --expired-from or --expired-to",
        )));
    }
    if let (Some(from), Some(to)) = (request.selection.expired_from, request.selection.expired_to)
        && request.selection.window_is_empty()
    {
        return Err(AppError::Config(ConfigError::new(
            "--expired-from",
            format!(
                "{} is not before --expired-to {} (the window is [from, to): it would select nothing)",
                rfc3339(&from),
                rfc3339(&to)
            ),
        )));
    }
    let mut conn = db::establish(database).await?;
    db::privileges::check(&mut conn, &[Use::Republish]).await?;
    let mut report = RepublishReport {
        replay_id: request.replay_id.unwrap_or_else(uuid::Uuid::new_v4),
        dry_run: request.dry_run,
        after: request.after,
        ..RepublishReport::default()
    };
    // Where the window lies in the audit trail, read once: each page then
    // reads about what it returns (see `db::replay`).
    let selection = &request.selection;
    let Some(bounds) = conn
        .transaction(async |conn| replay::id_bounds(conn, selection).await)
        .await?
    else {
        report.complete = true;
        tracing::info!(replay_id = %report.replay_id, "republish: no expiry in the window");
        return Ok(report);
    };
    let replay_span =
        tracing::info_span!("republish", replay_id = %report.replay_id, dry_run = request.dry_run);
    while !shutdown.is_cancelled() {
        let span = tracing::info_span!(
            parent: &replay_span,
            "republish_batch",
            replay_id = %report.replay_id,
            after = report.after,
            selected = tracing::field::Empty,
            tenant_count = tracing::field::Empty,
        );
        // Replay rows carry the replay's trace context, not the cycle's.
        let trace_headers = trace::headers_of(&span);
        let (after, batch_size, replay_id) = (report.after, request.batch_size, report.replay_id);
        let (rows, writes, enqueued) = conn
            .transaction(async |conn| {
                let rows = replay::page(conn, selection, &bounds, after, batch_size).await?;
                let mut writes = Vec::with_capacity(rows.len());
                for row in &rows {
                    let rebuilt = row
                        .to_domain()
                        .and_then(|record| record.rebuild().map_err(|e| e.to_string()));
                    match rebuilt {
                        Ok(event) => writes.push((
                            row.audit_id,
                            replay::ReplayWrite {
                                message: outbox_message(
                                    &event,
                                    RunId::new(row.correlation_id),
                                    row.ce_source.as_deref().unwrap_or(&events.ce_source),
                                    &trace_headers,
                                ),
                                correlation_id: row.correlation_id,
                            },
                        )),
                        Err(reason) => tracing::error!(
                            audit_id = row.audit_id,
                            booking_id = %row.booking_id,
                            %reason,
                            "cannot rebuild the event of this expiry; skipped"
                        ),
                    }
                }
                if request.dry_run {
                    return Ok::<_, DbError>((rows, writes, None));
                }
                let to_send: Vec<replay::ReplayWrite> =
                    writes.iter().map(|(_, w)| w.clone()).collect();
                let enqueued =
                    replay::enqueue(conn, &events.topic, SystemClock.now(), replay_id, &to_send)
                        .await?;
                Ok((rows, writes, Some(enqueued.len() as u64)))
            })
            .instrument(span.clone())
            .await?;
        let tenants: std::collections::HashSet<uuid::Uuid> =
            rows.iter().map(|r| r.tenant_id).collect();
        span.record("selected", rows.len());
        span.record("tenant_count", tenants.len());
        report.batches += 1;
        report.selected += rows.len() as u64;
        report.unrebuildable += (rows.len() - writes.len()) as u64;
        match enqueued {
            Some(enqueued) => {
                report.enqueued += enqueued;
                report.skipped_pending += writes.len() as u64 - enqueued;
            }
            None => {
                for (audit_id, write) in &writes {
                    on_event(&RepublishedEvent {
                        audit_id: *audit_id,
                        topic: events.topic.clone(),
                        key: write.message.key.clone(),
                        event_id: write.message.event_id,
                        headers: write.message.headers.iter().cloned().collect(),
                        value_hex: write
                            .message
                            .payload
                            .iter()
                            .map(|b| format!("{b:02x}"))
                            .collect(),
                    });
                }
                report.enqueued += writes.len() as u64;
            }
        }
        if let Some(last) = rows.last() {
            report.after = last.audit_id;
        }
        if rows.len() < request.batch_size as usize {
            report.complete = true;
            on_batch(&report);
            break;
        }
        on_batch(&report);
    }
    tracing::info!(
        replay_id = %report.replay_id,
        enqueued = report.enqueued,
        complete = report.complete,
        "republish finished"
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> RepublishRequest {
        RepublishRequest {
            selection: db::replay::Selection {
                booking_ids: vec![uuid::Uuid::from_u128(1)],
                tenant_ids: vec![uuid::Uuid::from_u128(2), uuid::Uuid::from_u128(3)],
                expired_from: chrono::DateTime::parse_from_rfc3339("2026-12-01T00:00:00Z")
                    .ok()
                    .map(|t| t.to_utc()),
                expired_to: chrono::DateTime::parse_from_rfc3339("2026-12-02T06:30:00.250Z")
                    .ok()
                    .map(|t| t.to_utc()),
            },
            dry_run: false,
            batch_size: 100,
            after: 0,
            replay_id: None,
        }
    }

    #[test]
    fn the_resume_command_carries_the_whole_selection_and_the_cursor() {
        let replay_id = uuid::Uuid::from_u128(9);
        let command = request().resume_command(&EventSettings::default(), 4711, replay_id);
        assert_eq!(
            command,
            "booking-expiration republish \
             --booking-id 00000000-0000-0000-0000-000000000001 \
             --tenant 00000000-0000-0000-0000-000000000002 \
             --tenant 00000000-0000-0000-0000-000000000003 \
             --expired-from 2026-12-01T00:00:00Z --expired-to 2026-12-02T06:30:00.250Z \
             --batch-size 100 --replay-id 00000000-0000-0000-0000-000000000009 --after 4711"
        );
    }

    #[test]
    fn the_resume_command_keeps_a_dry_run_and_settings_off_their_defaults() {
        let events = EventSettings {
            topic: "crm.replays".into(),
            ce_source: "/pin/crm/it's here".into(),
        };
        let request = RepublishRequest {
            dry_run: true,
            ..request()
        };
        let command = request.resume_command(&events, 1, uuid::Uuid::nil());
        assert!(command.contains(" --kafka-topic crm.replays "), "{command}");
        assert!(
            command.contains(r#" --ce-source '/pin/crm/it'\''s here' "#),
            "{command}"
        );
        assert!(command.ends_with(" --after 1 --dry-run"), "{command}");
    }
}
