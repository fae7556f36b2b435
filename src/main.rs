//! The `booking-expiration` binary: parse and validate the settings, set up
//! logging, run a command, map the outcome to an exit status (0 ok, 1
//! failure, 2 bad configuration, 3 migrations pending, 70 a task of `run`
//! ended on its own).

use std::{io::Write as _, process::ExitCode};

use anyhow::Context;
use booking_expiration::{
    app::{self, AppError},
    clock::SystemClock,
    config::{Cli, Command, ConfigError, DatabaseArgs, DatabaseSettings, OutboxCommand, Settings},
    db::{outbox::Unpark, replay::Selection},
    telemetry::{
        logging::{self, LogSetupError},
        trace::{OTLP_PROTOCOL, TraceSetupError},
    },
};
use clap::Parser;
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // A malformed setting: the same one line as any other bad setting.
        Err(error) if let Some(config) = ConfigError::from_clap(&error) => {
            return fail(&AppError::Config(config).into());
        }
        Err(error) => {
            // --help and --version exit 0; usage errors exit 2.
            let _ = error.print();
            return ExitCode::from(error.exit_code().clamp(0, 255) as u8);
        }
    };
    let trace = match logging::init() {
        Ok(guard) => guard,
        // LOG_FORMAT, RUST_LOG, the OTEL_* protocol: bad settings as any other.
        Err(LogSetupError::Setting { name, problem }) => {
            return fail(&AppError::Config(ConfigError::new(name, problem)).into());
        }
        Err(LogSetupError::Trace(TraceSetupError::Protocol { name, value })) => {
            let problem = format!("only {OTLP_PROTOCOL} is supported (got {value})");
            return fail(&AppError::Config(ConfigError::new(name, problem)).into());
        }
        Err(error) => return fail(&anyhow::Error::new(error)),
    };
    let code = match execute(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(&error),
    };
    // Flushes the spans still queued for export (which may log), then the
    // log lines still in the buffer.
    drop(trace);
    logging::flush();
    code
}

/// One line (or block) of a command's result on stdout. A reader that
/// went away (`status | head`) is not an error of the command.
fn out(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("cannot write to stdout"),
    }
}

fn fail(error: &anyhow::Error) -> ExitCode {
    let code = error
        .downcast_ref::<AppError>()
        .map_or(1, AppError::exit_code);
    // After the log lines still in the buffer (before logging is set up,
    // the buffer is empty and this is a plain stderr line).
    logging::stderr_line(&format!("booking-expiration: {error:#}"));
    ExitCode::from(code)
}

/// Validates the command's settings, then runs it until it ends or a
/// signal stops it.
fn execute(command: Command) -> anyhow::Result<()> {
    let invalid = AppError::Config;
    // Every command's database settings, with the start-up checks that need
    // the TLS library (certificate files, the CPU).
    // Each says where it connects and where the password comes from, once
    // its settings are valid.
    let database_settings = |args: DatabaseArgs| args.settings().and_then(app::checked_database);
    let announced = |settings: DatabaseSettings| {
        app::announce_database(&settings);
        settings
    };
    match command {
        Command::Migrate { database, check } => {
            // A session: DATABASE_URL, or DATABASE_DIRECT_URL past a
            // transaction pooler (required there).
            let database = database_settings(database)
                .and_then(|settings| settings.for_migrate())
                .map(announced)
                .map_err(invalid)?;
            block_on(async |_| {
                if check {
                    let pending = app::pending_migrations(&database).await?;
                    out(&serde_json::json!({ "pending": pending }).to_string())?;
                    if !pending.is_empty() {
                        return Err(AppError::MigrationsPending(pending.len()).into());
                    }
                } else {
                    app::migrate(&database).await?;
                }
                Ok(())
            })
        }
        Command::Once {
            database,
            expiry,
            shutdown,
            events,
        } => {
            let database = database_settings(database)
                .map(announced)
                .map_err(invalid)?;
            block_on(async |stop| {
                let report = app::once(&database, expiry, events, shutdown, stop).await?;
                out(&serde_json::to_string(&report)?)?;
                Ok(())
            })
        }
        Command::Status { database, json } => {
            let database = database_settings(database)
                .map(announced)
                .map_err(invalid)?;
            block_on(async |_| {
                let report = app::status(&database, &SystemClock).await?;
                if json {
                    out(&serde_json::to_string(&report)?)?;
                } else {
                    out(report.to_string().trim_end_matches('\n'))?;
                }
                Ok(())
            })
        }
        Command::Outbox {
            command:
                OutboxCommand::Retry {
                    database,
                    event_id,
                    all_parked,
                },
        } => {
            let database = database_settings(database)
                .map(announced)
                .map_err(invalid)?;
            let which = if all_parked {
                Unpark::All
            } else {
                Unpark::Events(event_id)
            };
            block_on(async |_| {
                let put_back = app::outbox_retry(&database, &which).await?;
                out(&format!("{{\"put_back\":{put_back}}}"))?;
                Ok(())
            })
        }
        Command::Republish(args) => {
            // Announced by `republish` once its selection is checked.
            let database = database_settings(args.database).map_err(invalid)?;
            let request = app::RepublishRequest {
                selection: Selection {
                    booking_ids: args.booking_id,
                    tenant_ids: args.tenant,
                    expired_from: args.expired_from,
                    expired_to: args.expired_to,
                },
                dry_run: args.dry_run,
                batch_size: args.batch.batch_size,
                after: args.after,
                replay_id: args.replay_id,
            };
            let events = args.events;
            block_on(async |stop| {
                let mut stdout = std::io::stdout().lock();
                let mut printed = Ok(());
                let report = app::republish(
                    &database,
                    &events,
                    &request,
                    &SystemClock,
                    stop,
                    |event| {
                        if printed.is_ok() {
                            printed = serde_json::to_string(event)
                                .map_err(std::io::Error::from)
                                .and_then(|line| writeln!(stdout, "{line}"));
                        }
                    },
                    |progress| match serde_json::to_string(progress) {
                        Ok(line) => logging::stderr_line(&line),
                        Err(error) => tracing::warn!(%error, "progress not printed"),
                    },
                )
                .await?;
                printed.context("cannot write the events to stdout")?;
                let summary = serde_json::to_string(&report)?;
                if request.dry_run {
                    logging::stderr_line(&summary);
                } else {
                    writeln!(stdout, "{summary}")?;
                }
                if !report.complete {
                    let resume = request.resume_command(&events, report.after, report.replay_id);
                    return Err(AppError::ReplayStopped { resume }.into());
                }
                Ok(())
            })
        }
        Command::Seed { database, seed } => {
            let database = database_settings(database)
                .map(announced)
                .map_err(invalid)?;
            block_on(async |_| {
                let inserted = app::seed(&database, &seed, &SystemClock).await?;
                out(&format!("{{\"inserted\":{inserted}}}"))?;
                Ok(())
            })
        }
        Command::Run(args) => {
            let settings =
                Settings::checked_from_args(args, app::STARTUP_CHECKS).map_err(invalid)?;
            block_on(async |stop| Ok(app::run(settings, stop).await?))
        }
    }
}

/// Runs `task` on a multi-thread runtime with a token that SIGTERM and
/// SIGINT cancel.
fn block_on(task: impl AsyncFnOnce(CancellationToken) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        app::cancel_on_signal(shutdown.clone());
        task(shutdown).await
    })
}
