//! The Java consumer (consumers/java, kafka-clients + protobuf-java generated
//! from proto/) against the real broker, after the worker binary expired a
//! known set of bookings and its publisher put them on a fresh topic: every
//! booking arrives once, its fields decode equal to the database row, and
//! each record sits on the partition Java's own default partitioner computes
//! for its key.

use std::{collections::BTreeMap, time::Duration};

use crate::support::*;
use chrono::{DateTime, Utc};
use uuid::Uuid;

const PARTITIONS: i32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_consumer_reads_what_the_worker_expired() {
    let db = TestDb::new().await;
    let now = wall_now();
    let past = |minutes: i64| now - chrono::Duration::minutes(minutes);
    let mut bookings = Vec::new();
    for i in 0..20 {
        bookings.push(NewBooking::new("Reserved").reserve_deadline(past(i + 1)));
        bookings.push(NewBooking::new("AwaitingPayment").reserve_deadline(past(i + 2)));
        bookings.push(
            NewBooking::new("Booked")
                .reserve_deadline(past(600))
                .booking_deadline(past(i + 1)),
        );
    }
    // Not due, must not be published.
    bookings.push(NewBooking::new("Reserved").reserve_deadline(now + chrono::Duration::hours(1)));
    db.insert_all(&bookings).await;
    let due = bookings.len() - 1;

    // The outbox row carries its topic, so the worker is told it too.
    let topic = create_topic(PARTITIONS).await;
    let once = binary()
        .arg("once")
        .env("DATABASE_URL", &db.url)
        .env("KAFKA_TOPIC", &topic)
        .output()
        .expect("run once");
    assert!(
        once.status.success(),
        "once failed: {}",
        String::from_utf8_lossy(&once.stderr)
    );

    let mut publisher = binary();
    publisher
        .args(["run", "--no-worker"])
        .env("DATABASE_URL", &db.url)
        .env("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap().join(","))
        .env("KAFKA_TOPIC", &topic)
        .env("METRICS_ADDR", format!("127.0.0.1:{}", free_port()));
    let mut running = Running::spawn(publisher);
    db.wait_all_published(Duration::from_secs(60)).await;
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));

    let consumer = std::process::Command::new("bash")
        .arg(format!(
            "{}/scripts/java-consumer.sh",
            env!("CARGO_MANIFEST_DIR")
        ))
        .args(["--bootstrap-servers", &kafka_bootstrap().join(",")])
        .args(["--topic", &topic, "--json", "--strict"])
        .args(["--expect", &due.to_string(), "--max-idle-ms", "60000"])
        .output()
        .expect("run scripts/java-consumer.sh");
    let stderr = String::from_utf8_lossy(&consumer.stderr);
    assert!(consumer.status.success(), "Java consumer failed:\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "records={due} distinct={due} duplicates=0 invalid=0 misrouted=0 conflicting=0"
        )),
        "summary line:\n{stderr}"
    );

    let stored = db.bookings_by_id().await;
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&consumer.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(events.len(), due, "one line per booking");

    let text = |event: &serde_json::Value, field: &str| -> String {
        event[field]
            .as_str()
            .unwrap_or_else(|| panic!("{field} missing in {event}"))
            .to_owned()
    };
    let uuid = |event: &serde_json::Value, field: &str| -> Uuid {
        text(event, field).parse().expect("a UUID")
    };
    let mut seen = BTreeMap::new();
    for event in &events {
        let id = uuid(event, "booking_id");
        let row = stored
            .get(&id)
            .unwrap_or_else(|| panic!("unknown booking {id}"));
        assert!(seen.insert(id, ()).is_none(), "{id} twice");
        assert_eq!(text(event, "key"), id.to_string());
        assert_eq!(uuid(event, "tenant_id"), row.tenant_id);
        assert_eq!(Some(uuid(event, "deal_id")), row.deal_id);
        assert_eq!(
            Some(uuid(event, "property_object_id")),
            row.property_object_id
        );
        let phase = match row.status.as_str() {
            "ReserveExpired" => "RESERVE",
            "BookingExpired" => "BOOKING",
            other => panic!("{id} published but stored as {other}"),
        };
        assert_eq!(text(event, "phase"), phase, "{id}");
        let expired_at: DateTime<Utc> = DateTime::parse_from_rfc3339(&text(event, "expired_at"))
            .expect("expired_at is RFC 3339")
            .into();
        assert_eq!(Some(expired_at), row.expired_at, "{id}");
        assert_eq!(event["topic"], topic.as_str());
        let partition = event["partition"].as_i64().expect("partition");
        assert!((0..PARTITIONS as i64).contains(&partition));
        assert_eq!(
            event["expected_partition"].as_i64(),
            Some(partition),
            "{id}: Java's default partitioner disagrees"
        );
        assert_eq!(event["headers"]["ce_id"], event["event_id"]);
        // The consumer continues the cycle's trace: a child of the record's span.
        let traceparent = text(&event["headers"], "traceparent");
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(event["trace"]["trace_id"], parts[1], "{traceparent}");
        assert_eq!(event["trace"]["parent_span_id"], parts[2], "{traceparent}");
        assert_ne!(event["trace"]["span_id"], parts[2]);
        assert_eq!(
            event["trace"]["traceparent"],
            format!(
                "00-{}-{}-{}",
                parts[1],
                event["trace"]["span_id"].as_str().expect("span_id"),
                parts[3]
            )
            .as_str()
        );
        assert_eq!(
            event["headers"]["tenant_id"],
            row.tenant_id.to_string().as_str()
        );
    }
    assert_eq!(seen.len(), due, "every due booking arrived");
    let partitions_used: std::collections::BTreeSet<i64> = events
        .iter()
        .filter_map(|e| e["partition"].as_i64())
        .collect();
    assert_eq!(partitions_used.len(), PARTITIONS as usize, "keys spread");
}
