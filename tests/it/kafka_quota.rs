//! A produce quota on a real broker: the `run` binary at its defaults
//! publishes 10,000 due bookings while the broker throttles its client id
//! to `producer_byte_rate=100000` (a client quota set through Kafka's
//! Admin API, `alterClientQuotas`, as shared and managed clusters set
//! them).
//!
//! A throttled answer acknowledges its records (KIP-219): they are marked,
//! never sent again, and the next request to that broker waits out the
//! hold the broker asked for. Asserted:
//!
//! - **no record written twice**: 10,000 records on the topic, one per
//!   booking (rskafka's `PartitionClient`, which re-sent every throttled
//!   request, wrote 102,406 for the same 10,000);
//! - **drained at the quota's pace**: from the first row published to the
//!   last within [`PACE`] (1.3x) of the records' bytes ÷ the quota (the
//!   records' encoded size, which the produce requests carry and a little
//!   more, so the bound is on the strict side);
//! - **said, not shouted**: the throttle is counted in
//!   `crm_booking_expiration_kafka_throttle_seconds_total` and said in the
//!   log at most once a minute (one broker here).
//!
//! The quota is set for the test's own client id (`KAFKA_CLIENT_ID`), so
//! the suite's other tests on the shared broker are not throttled.

use std::{collections::BTreeMap, time::Duration};

use rskafka::protocol::{
    record::{Record, RecordHeader},
    traits::WriteType,
};

use crate::support::*;

const DUE: u64 = 10_000;
const PARTITIONS: i32 = 3;
/// The quota, bytes per second of produce requests.
const QUOTA: u64 = 100_000;
/// The drain within this factor of bytes ÷ quota (the bound).
const PACE: f64 = 1.3;

fn kafka_port() -> String {
    let bootstrap = kafka_bootstrap()[0].clone();
    let (_, port) = bootstrap.rsplit_once(':').expect("host:port");
    port.to_owned()
}

/// A record's size in a batch on the wire (its varint-framed encoding).
fn encoded_size(record: &testkit::kafka::ConsumedRecord) -> u64 {
    let mut buf = Vec::new();
    Record {
        timestamp_delta: 0,
        offset_delta: 0,
        key: Some(record.key.clone().into_bytes()),
        value: Some(record.value.clone()),
        headers: record
            .headers
            .iter()
            .map(|(key, value)| RecordHeader {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
    }
    .write(&mut buf)
    .expect("in memory");
    buf.len() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_produce_quota_no_record_is_written_twice() {
    let db = TestDb::new().await;
    let topic = create_topic(PARTITIONS).await;
    let client_id = format!("quota-{topic}");
    testkit::run_script(
        "kafka.sh",
        &[
            "alter-client-quota",
            &kafka_port(),
            &client_id,
            &format!("producer_byte_rate={QUOTA}"),
        ],
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    db.seed_due(DUE, wall_now()).await;

    let addr = format!("127.0.0.1:{}", free_port());
    let mut command = run_on(&db, &topic, &addr);
    command.env("KAFKA_CLIENT_ID", &client_id);
    let mut running = Running::spawn(command);
    wait_until(
        "every booking published",
        Duration::from_secs(180),
        || async { db.published().await == DUE as i64 },
    )
    .await;
    let throttled = metric(
        &addr,
        "crm_booking_expiration_kafka_throttled_responses_total",
    )
    .await;
    let held = metric(&addr, "crm_booking_expiration_kafka_throttle_seconds_total").await;
    running.terminate();
    assert!(running.wait(Duration::from_secs(30)).await.success());
    let log = running.stderr();

    let drained = db
        .names(
            "SELECT (extract(epoch FROM max(published_at) - min(published_at)))::text AS name \
             FROM booking_expiration_outbox",
        )
        .await;
    let drained: f64 = drained[0].parse().expect("seconds");

    let records = read_topic(&topic, PARTITIONS).await;
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for record in &records {
        *copies
            .entry(record.header("ce_id").expect("ce_id"))
            .or_default() += 1;
    }
    let twice = copies.values().filter(|n| **n > 1).count();
    let bytes: u64 = records.iter().map(encoded_size).sum();
    let at_quota = bytes as f64 / QUOTA as f64;
    let lines = log
        .lines()
        .filter(|line| line.contains("throttles this client"))
        .count();
    eprintln!(
        "FIGURES kafka-quota: {} records for {DUE} bookings, {twice} written twice; \
         {bytes} bytes, drained in {drained:.1} s (bytes / quota = {at_quota:.1} s, ratio {:.2}); \
         {throttled} throttled answers holding {held:.1} s; {lines} log lines",
        records.len(),
        drained / at_quota,
    );
    assert_eq!(records.len() as u64, DUE, "one record per booking");
    assert_eq!(copies.len() as u64, DUE, "every booking on the topic");
    assert_eq!(twice, 0, "no record written twice");
    assert!(
        throttled > 0.0 && held > 0.0,
        "the broker throttled the client"
    );
    assert!(
        drained <= PACE * at_quota,
        "drained in {drained:.1} s, more than {PACE} x {at_quota:.1} s"
    );
    let minutes = (drained / 60.0).ceil() as usize + 1;
    assert!(
        (1..=minutes).contains(&lines),
        "{lines} throttle lines in the log for {drained:.0} s"
    );
}
