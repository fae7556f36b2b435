//! Logging at the binary's defaults (no `RUST_LOG`: `info`), written to a
//! file as a container's stdout is, over a cycle that touches a thousand
//! tenants: the log costs the same per booking whatever the number of
//! tenants. Spans carry counts, never lists, and a span field is recorded
//! once, so no line grows with the batch or the cycle.

use std::collections::BTreeMap;

use crate::support::*;

/// Due bookings of the cycle, spread over `TENANTS` tenants.
const BOOKINGS: i64 = 2_000;
const TENANTS: i64 = 1_000;
/// The budget per expired booking and per line.
const BYTES_PER_BOOKING: u64 = 1_024;
const LONGEST_LINE: usize = 8 * 1_024;

/// Runs `once` with the binary's default log level and `format`
/// (`None`: text), its stderr in a file; returns the log.
async fn once_logged(format: Option<&str>) -> (String, u64) {
    let db = TestDb::new().await;
    let as_of = wall_now() - chrono::Duration::minutes(1);
    db.seed_due(BOOKINGS as u64, as_of).await;
    // A thousand tenants among the due bookings, each with about two.
    db.exec_sql(&format!(
        "WITH numbered AS (SELECT id, row_number() OVER (ORDER BY id) AS i FROM bookings)
         UPDATE bookings b SET tenant_id = md5((numbered.i % {TENANTS})::text)::uuid
           FROM numbered WHERE numbered.id = b.id"
    ))
    .await;
    let due = db
        .count(&format!(
            "SELECT count(*) AS n FROM bookings
              WHERE (status IN ('Reserved', 'AwaitingPayment') AND reserve_expires_at <= '{now}')
                 OR (status = 'Booked' AND booking_expires_at <= '{now}')",
            now = wall_now().to_rfc3339()
        ))
        .await;
    assert!(due >= BOOKINGS / 2, "{due} due bookings");
    let tenants = db
        .count("SELECT count(DISTINCT tenant_id) AS n FROM bookings")
        .await;
    assert_eq!(tenants, TENANTS, "a thousand tenants");

    let dir = tempdir("logging");
    let path = dir.join("stderr.log");
    let file = std::fs::File::create(&path).expect("log file");
    let mut command = binary();
    command
        .arg("once")
        .env("DATABASE_URL", &db.url)
        .env_remove("RUST_LOG")
        .env_remove("LOG_FORMAT")
        .stderr(file);
    if let Some(format) = format {
        command.env("LOG_FORMAT", format);
    }
    let output = command.output().expect("run once");
    let log = std::fs::read_to_string(&path).expect("read the log");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(output.status.success(), "once failed:\n{log}");
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("once prints its JSON report");
    let expired = ["reserve_expired_count", "booking_expired_count"]
        .iter()
        .map(|k| report[k].as_u64().expect("a count"))
        .sum::<u64>();
    assert_eq!(expired as i64, due, "every due booking expired: {report}");
    (log, expired)
}

/// The log's size per expired booking and its longest line, within budget,
/// and the spec's lines (§6) all there: one `booking expired` per booking.
fn assert_bounded(format: &str, log: &str, expired: u64, message: impl Fn(&str) -> String) {
    let bytes = log.len() as u64;
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    eprintln!(
        "{format}: {bytes} bytes for {expired} expired bookings ({} per booking), longest line {longest} bytes",
        bytes / expired.max(1)
    );
    assert!(
        bytes <= BYTES_PER_BOOKING * expired,
        "{format}: {bytes} bytes of log for {expired} bookings ({} per booking)",
        bytes / expired.max(1)
    );
    let long = log.lines().find(|l| l.len() > LONGEST_LINE);
    assert!(
        long.is_none(),
        "{format}: a line of {longest} bytes: {:.300}",
        long.unwrap_or_default()
    );
    let mut lines = BTreeMap::<String, u64>::new();
    for line in log.lines() {
        *lines.entry(message(line)).or_default() += 1;
    }
    assert_eq!(lines.get("booking expired"), Some(&expired), "{lines:?}");
    for spec_line in ["cycle started", "batch selected", "cycle completed"] {
        assert!(lines.contains_key(spec_line), "{format}: no `{spec_line}`");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_cost_the_same_per_booking_whatever_the_tenants() {
    let (log, expired) = once_logged(None).await;
    assert_bounded("text", &log, expired, |line| {
        // `<time> <LEVEL> <spans>: <target>: <message> <fields>`
        let after_target = line.split(": ").nth(2).unwrap_or(line);
        [
            "booking expired",
            "cycle started",
            "batch selected",
            "cycle completed",
        ]
        .into_iter()
        .find(|m| after_target.starts_with(m))
        .unwrap_or("other")
        .to_owned()
    });
    // A span's field is recorded once: each span in a line's prefix names
    // each of its fields once.
    for line in log.lines() {
        let prefix = line.split(": ").next().unwrap_or_default();
        for span in prefix.split("}:") {
            let Some((_, fields)) = span.split_once('{') else {
                continue;
            };
            let mut keys: Vec<&str> = fields
                .split(' ')
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
                .collect();
            let all = keys.len();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), all, "a field recorded twice: {line:.300}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_cost_the_same_per_booking_whatever_the_tenants() {
    let (log, expired) = once_logged(Some("json")).await;
    assert_bounded("json", &log, expired, |line| {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:.300}"));
        value["fields"]["message"]
            .as_str()
            .unwrap_or("other")
            .to_owned()
    });
    let completed = log
        .lines()
        .find(|l| l.contains("\"cycle completed\""))
        .expect("cycle completed");
    let completed: serde_json::Value = serde_json::from_str(completed).expect("JSON");
    assert_eq!(
        completed["span"]["tenant_count"].as_u64(),
        Some(TENANTS as u64),
        "the cycle span counts its tenants: {completed}"
    );
}
