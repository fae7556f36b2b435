//! Test support: the servers the test command started (checked once, with
//! one clear message when they are missing), the settings the tests build
//! the worker and publisher from, and waiting on a condition with a
//! deadline. Fixtures by concern: [`db`] (a fresh database per test,
//! bookings), [`kafka`] (a fresh topic per test, reading it back) and
//! [`process`] (the binary under test, scripts, HTTP, ports).

mod db;
mod kafka;
mod otelcol;
mod process;
mod publishing;
mod scheduler;

use std::{
    future::Future,
    io::Write,
    sync::OnceLock,
    time::{Duration, Instant},
};

use booking_expiration::{
    clock::ManualClock,
    config::{DatabaseSettings, EventSettings, ExpirySettings, KafkaSettings},
    libpq::DatabaseUrl,
};
use chrono::{DateTime, TimeZone, Utc};

pub use db::*;
pub use kafka::*;
pub use otelcol::Collector;
pub use process::*;
pub use publishing::*;
pub use scheduler::Scheduler;

/// The servers the test command (`bash scripts/test.sh`) started.
struct Servers {
    database_url: String,
    kafka_bootstrap: Vec<String>,
}

/// The servers, read from the environment at the first use. Without them
/// the run stops there with one message (not one panic per test) and exit
/// status 2; tests never skip.
fn servers() -> &'static Servers {
    static SERVERS: OnceLock<Servers> = OnceLock::new();
    SERVERS.get_or_init(|| {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        match (var("DATABASE_URL"), var("KAFKA_BOOTSTRAP_SERVERS")) {
            (Some(database_url), Some(bootstrap)) => Servers {
                database_url,
                kafka_bootstrap: bootstrap.split(',').map(str::to_owned).collect(),
            },
            (database_url, bootstrap) => {
                let missing: Vec<&str> = [
                    database_url.is_none().then_some("DATABASE_URL"),
                    bootstrap.is_none().then_some("KAFKA_BOOTSTRAP_SERVERS"),
                ]
                .into_iter()
                .flatten()
                .collect();
                // Straight to the process's stderr: libtest captures
                // `eprintln!` per test and would lose it on exit.
                let verb = if missing.len() == 1 { "is" } else { "are" };
                let _ = writeln!(
                    std::io::stderr(),
                    "\nerror: the integration tests need PostgreSQL and Kafka, and {} {verb} not set.\n\
                     Run them with the test command, which starts both and stops them afterwards:\n\n    \
                     bash scripts/test.sh [cargo test arguments, e.g. --test it faults::]\n",
                    missing.join(" and ")
                );
                std::process::exit(2);
            }
        }
    })
}

/// The admin URL of the test PostgreSQL.
pub fn admin_url() -> String {
    servers().database_url.clone()
}

/// The bootstrap servers of the test Kafka.
pub fn kafka_bootstrap() -> Vec<String> {
    servers().kafka_bootstrap.clone()
}

pub fn database_settings(url: &str) -> DatabaseSettings {
    DatabaseSettings {
        pool_size: 8,
        connect_timeout: Duration::from_secs(5),
        statement_timeout: Duration::from_secs(30),
        ..DatabaseSettings::new(DatabaseUrl::parse(url).expect("valid test URL"))
    }
}

/// The wall clock, through the product's one clock seam (clippy.toml forbids
/// `Utc::now()` elsewhere).
pub fn wall_now() -> DateTime<Utc> {
    booking_expiration::clock::Clock::now(&booking_expiration::clock::SystemClock)
}

/// A fixed, round reference time for deterministic tests.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2027, 3, 1, 12, 0, 0).unwrap()
}

/// The manual clock at `t0()`.
pub fn clock() -> ManualClock {
    ManualClock::new(t0())
}

pub fn expiry_settings(batch_size: u32) -> ExpirySettings {
    ExpirySettings {
        interval: Duration::from_secs(60),
        batch_size,
        max_batches_per_cycle: 1000,
        cycle_budget: Duration::from_secs(30),
        // Tests set the clock far from the database's on purpose.
        max_clock_skew: None,
        ..ExpirySettings::default()
    }
}

/// The default `ce_source` and the topic `topic`.
pub fn events_on(topic: &str) -> EventSettings {
    EventSettings {
        topic: topic.to_owned(),
        ..EventSettings::default()
    }
}

pub fn kafka_settings(bootstrap: Vec<String>) -> KafkaSettings {
    KafkaSettings {
        client_id: "booking-expiration-test".into(),
        ..KafkaSettings::new(bootstrap)
    }
}

/// Polls `condition` every 50 ms until it holds or `timeout` passes.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
