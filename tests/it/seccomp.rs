//! The `run` binary under a seccomp filter shaped like a container
//! runtime's default profile (`scripts/seccomp-run.sh`: `pidfd_getfd`,
//! `ptrace`, `process_vm_readv`/`writev` and `kcmp` denied, as Docker's
//! default profile and Kubernetes' `RuntimeDefault` deny them without
//! `CAP_SYS_PTRACE`), against the same binary without it.
//!
//! The filter kills the process on a denied call, so a worker that needed
//! one to publish would die here, loudly, instead of running on with an
//! option silently lost (the way `TCP_NODELAY` was lost when it depended
//! on `pidfd_getfd`). The filter's effect is checked first
//! (`seccomp-run.sh check`: `pidfd_getfd` fails with EPERM under it).
//!
//! Each run expires and publishes [`DUE`] bookings falling due over
//! [`SPREAD`] (a trickle: requests of a few records, where Nagle's
//! algorithm, were it on, would hold each one up to 40 ms), and measures
//! the outbox write → broker acknowledgement (`published_at` −
//! `created_at`) of every row. Two runs each way, unrestricted, restricted,
//! restricted, unrestricted, so a drift from run to run does not fall on
//! one side only (with one run each, the restricted one second, CI once saw
//! p99 21.0 ms unrestricted against 27.1 ms). Asserted: everything
//! published once, exit 0, and the restricted runs' p50 and p99 within 10%
//! of the unrestricted runs', or [`SLACK`] above it where 10% is less (a few
//! milliseconds of a busy 2-core machine's scheduling; a lost
//! `TCP_NODELAY` adds tens of milliseconds to most requests).
//!
//! `#[ignore]`d in the parallel suite (its bound is a latency);
//! `scripts/test.sh` runs it alone after the suite.

use std::{process::Command, time::Duration};

use crate::support::*;

const DUE: usize = 1_500;
const SPREAD: Duration = Duration::from_secs(10);
const PARTITIONS: i32 = 3;
/// The latency bound's floor above the unrestricted figure.
const SLACK: Duration = Duration::from_millis(5);

/// `command` run by `scripts/seccomp-run.sh` under the filter, with the
/// same arguments and environment.
fn under_seccomp(command: &Command) -> Command {
    let mut wrapped = testkit::script("seccomp-run.sh");
    wrapped.arg("--").arg(command.get_program());
    wrapped.args(command.get_args());
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => wrapped.env(name, value),
            None => wrapped.env_remove(name),
        };
    }
    wrapped
}

/// Write → acknowledgement of every row of one run (seconds).
async fn one_run(restricted: bool) -> Vec<f64> {
    let db = TestDb::new().await;
    let topic = create_topic(PARTITIONS).await;
    let first = wall_now() + chrono::Duration::seconds(3);
    let bookings = falling_due(DUE as u64, first, SPREAD, |at| {
        NewBooking::new("Reserved").reserve_deadline(at)
    });
    db.insert_all(&bookings).await;
    let command = run_on(&db, &topic, &format!("127.0.0.1:{}", free_port()));
    let command = if restricted {
        under_seccomp(&command)
    } else {
        command
    };
    let mut running = Running::spawn(command);
    wait_until(
        "every booking published",
        SPREAD + Duration::from_secs(60),
        || async { db.published().await == DUE as i64 },
    )
    .await;
    running.terminate();
    let status = running.wait(Duration::from_secs(30)).await;
    assert!(
        status.success(),
        "restricted={restricted}: {status:?}\n{}",
        running.stderr()
    );
    let records = read_topic(&topic, PARTITIONS).await;
    assert_eq!(records.len(), DUE, "restricted={restricted}: once each");
    db.names(
        "SELECT (extract(epoch FROM published_at - created_at))::text AS name \
             FROM booking_expiration_outbox",
    )
    .await
    .iter()
    .map(|s| s.parse().expect("seconds"))
    .collect()
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a latency bound: run alone by scripts/test.sh"]
async fn under_a_runtime_default_seccomp_profile_publishing_is_as_fast() {
    let check = testkit::run_script("seccomp-run.sh", &["check"])
        .unwrap_or_else(|e| panic!("the filter does not work here: {e:#}"));
    eprintln!("{}", check.trim());
    // In the order A B B A: whatever drifts from one run to the next (the
    // shared PostgreSQL and broker gain a database and a topic with each)
    // weighs on both sides alike. Quantiles over both runs of a side.
    let mut free = one_run(false).await;
    let mut restricted = one_run(true).await;
    restricted.extend(one_run(true).await);
    free.extend(one_run(false).await);
    free.sort_by(f64::total_cmp);
    restricted.sort_by(f64::total_cmp);
    let mut failed = Vec::new();
    for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
        let (a, b) = (quantile(&free, q), quantile(&restricted, q));
        let bound = (a * 1.1).max(a + SLACK.as_secs_f64());
        eprintln!(
            "FIGURES seccomp: write -> ack {name}: {:.1} ms unrestricted, {:.1} ms under the filter (bound {:.1} ms)",
            a * 1e3,
            b * 1e3,
            bound * 1e3
        );
        if b > bound {
            failed.push(format!("{name} {:.1} ms > {:.1} ms", b * 1e3, bound * 1e3));
        }
    }
    assert!(failed.is_empty(), "slower under the filter: {failed:?}");
}
