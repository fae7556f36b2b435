//! The `booking-expiration` binary: parse, set up logging, run a command,
//! map the outcome to an exit status (0 ok, 1 failure, 2 bad configuration).

use std::process::ExitCode;

use anyhow::Context;
use booking_expiration::{
    app::{self, AppError},
    config::{Cli, Command},
    telemetry::logging,
};
use clap::Parser;
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            // --help and --version exit 0; usage errors exit 2.
            let _ = error.print();
            return ExitCode::from(error.exit_code().clamp(0, 255) as u8);
        }
    };
    logging::init();
    match execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let code = error
                .downcast_ref::<AppError>()
                .map_or(1, AppError::exit_code);
            eprintln!("booking-expiration: {error:#}");
            ExitCode::from(code)
        }
    }
}

fn execute(cli: Cli) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        app::cancel_on_signal(shutdown.clone());
        match cli.command {
            Command::Migrate { database } => {
                app::migrate(&database).await?;
            }
            Command::Once { database, expiry } => {
                let report = app::once(&database, &expiry, shutdown).await?;
                println!("{}", serde_json::to_string(&report)?);
            }
            Command::Status { database, json } => {
                let report = app::status(&database).await?;
                if json {
                    println!("{}", serde_json::to_string(&report)?);
                } else {
                    print!("{report}");
                }
            }
            Command::Seed { database, seed } => {
                let inserted = app::seed(&database, &seed).await?;
                println!("{{\"inserted\":{inserted}}}");
            }
            Command::Run {
                database,
                expiry,
                kafka,
                publisher,
                metrics_addr,
                liveness_window,
                no_worker,
                no_publisher,
            } => {
                app::run(
                    app::RunArgs {
                        database: &database,
                        expiry: &expiry,
                        kafka: &kafka,
                        publisher: &publisher,
                        metrics_addr: &metrics_addr,
                        liveness_window: &liveness_window,
                        no_worker,
                        no_publisher,
                    },
                    shutdown,
                )
                .await?;
            }
        }
        Ok(())
    })
}
