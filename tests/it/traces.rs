//! Traces across the Kafka hop, against a real OpenTelemetry Collector
//! (OTLP/HTTP receiver, file exporter; built by scripts/otelcol.sh, path in
//! `OTELCOL_BIN`): the worker exports its cycle span and the batch spans
//! with the run id and the number of tenants (counts, never lists: every
//! attribute stays small however many tenants a cycle touches), and every
//! record's `traceparent` names the cycle's trace and one of its batch spans.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use crate::support::*;
use serde_json::Value;
use uuid::Uuid;

const PARTITIONS: i32 = 2;

/// One exported span, from the collector's OTLP JSON.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    attributes: BTreeMap<String, String>,
}

fn string_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Object(map) => map
            .get("stringValue")
            .or_else(|| map.get("intValue"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| value.to_string()),
        other => other.to_string(),
    }
}

fn attributes(list: &Value) -> BTreeMap<String, String> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|kv| (string_of(&kv["key"]), string_of(&kv["value"])))
        .collect()
}

/// Every span in the file exporter's output (one OTLP JSON document a line).
fn exported_spans(path: &std::path::Path) -> Vec<Span> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut spans = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(doc) = serde_json::from_str::<Value>(line) else {
            continue; // a line still being written
        };
        for resource in doc["resourceSpans"].as_array().into_iter().flatten() {
            let service = attributes(&resource["resource"]["attributes"])
                .remove("service.name")
                .unwrap_or_default();
            for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                for span in scope["spans"].as_array().into_iter().flatten() {
                    spans.push(Span {
                        service: service.clone(),
                        trace_id: string_of(&span["traceId"]),
                        span_id: string_of(&span["spanId"]),
                        parent_span_id: string_of(&span["parentSpanId"]),
                        name: string_of(&span["name"]),
                        attributes: attributes(&span["attributes"]),
                    });
                }
            }
        }
    }
    spans
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cycle_and_batch_spans_reach_the_collector_and_the_records_name_them() {
    let collector = Collector::start().await;
    let (endpoint, spans_file) = (collector.endpoint.clone(), collector.spans_file.clone());

    // Forty due bookings of forty tenants: four batches of ten.
    const BOOKINGS: usize = 40;
    let db = TestDb::new().await;
    let tenants: Vec<Uuid> = (0..BOOKINGS).map(|_| Uuid::new_v4()).collect();
    let past = wall_now() - chrono::Duration::minutes(5);
    let bookings: Vec<NewBooking> = tenants
        .iter()
        .map(|tenant| {
            let mut b = NewBooking::new("Reserved").reserve_deadline(past);
            b.tenant_id = *tenant;
            b
        })
        .collect();
    db.insert_all(&bookings).await;
    let topic = create_topic(PARTITIONS).await;
    let once = binary()
        .arg("once")
        .env("DATABASE_URL", &db.url)
        .env("KAFKA_TOPIC", &topic)
        .env("EXPIRATION_BATCH_SIZE", "10")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{endpoint}"))
        .env("OTEL_SERVICE_NAME", "booking-expiration-it")
        .env("OTEL_TRACES_SAMPLER", "always_on")
        // The log level does not limit the trace.
        .env("RUST_LOG", "warn")
        .output()
        .expect("run once");
    assert!(
        once.status.success(),
        "{}",
        String::from_utf8_lossy(&once.stderr)
    );

    // Publish with the binary, no tracing variables: the header travels as written.
    let addr = format!("127.0.0.1:{}", free_port());
    let mut publisher = binary();
    publisher
        .args(["run", "--no-worker"])
        .env("DATABASE_URL", &db.url)
        .env("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap().join(","))
        .env("KAFKA_TOPIC", &topic)
        .env("METRICS_ADDR", &addr);
    let mut running = Running::spawn(publisher);
    db.wait_all_published(Duration::from_secs(60)).await;
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));
    let records = read_topic(&topic, PARTITIONS).await;
    assert_eq!(records.len(), BOOKINGS);
    let run_id = records[0].header("correlation_id").expect("correlation_id");

    let mut spans = Vec::new();
    wait_until(
        "the cycle's spans in the collector",
        Duration::from_secs(30),
        || {
            spans = exported_spans(&spans_file);
            let done = spans.iter().filter(|s| s.name == "expiry_batch").count() >= 5
                && spans.iter().any(|s| s.name == "expiry_cycle");
            async move { done }
        },
    )
    .await;
    collector.stop().await;

    let cycle = spans
        .iter()
        .find(|s| s.name == "expiry_cycle")
        .expect("the cycle span");
    assert_eq!(cycle.service, "booking-expiration-it", "OTEL_SERVICE_NAME");
    assert_eq!(cycle.attributes.get("run_id"), Some(&run_id));
    assert_eq!(
        cycle.attributes.get("tenant_count"),
        Some(&BOOKINGS.to_string())
    );
    // No attribute grows with the cycle: the longest values are ids and
    // source locations, whatever the number of tenants.
    for span in &spans {
        for (key, value) in &span.attributes {
            assert!(
                value.len() <= 128,
                "{}: attribute {key} is {} bytes",
                span.name,
                value.len()
            );
        }
        assert!(!span.attributes.contains_key("tenant_ids"), "{span:?}");
    }

    let batches: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "expiry_batch" && s.parent_span_id == cycle.span_id)
        .collect();
    // Four full batches of the Reserve phase, the empty fifth, one empty Booking batch.
    assert!(batches.len() >= 5, "{batches:#?}");
    let mut batch_tenants = 0;
    for batch in &batches {
        assert_eq!(batch.trace_id, cycle.trace_id);
        assert_eq!(batch.attributes.get("run_id"), Some(&run_id));
        let count = batch.attributes.get("tenant_count").expect("tenant_count");
        batch_tenants += count.parse::<usize>().expect("a count");
    }
    // Every booking its own tenant, every booking in one batch.
    assert_eq!(batch_tenants, BOOKINGS);

    let batch_ids: BTreeSet<&str> = batches.iter().map(|b| b.span_id.as_str()).collect();
    for record in &records {
        let traceparent = record.header("traceparent").expect("traceparent");
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(parts.len(), 4, "{traceparent}");
        assert_eq!(parts[0], "00");
        assert_eq!(
            parts[1], cycle.trace_id,
            "the record names the cycle's trace"
        );
        assert!(
            batch_ids.contains(parts[2]),
            "{traceparent}: parent is one of the cycle's batch spans"
        );
        assert_eq!(parts[3], "01", "sampled");
        let tenant: Uuid = record.header("tenant_id").unwrap().parse().unwrap();
        assert!(tenants.contains(&tenant), "the record names its tenant");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_otel_variables_records_still_carry_a_traceparent() {
    let db = TestDb::new().await;
    let past = wall_now() - chrono::Duration::minutes(5);
    db.insert_all(
        &(0..3)
            .map(|_| NewBooking::new("Reserved").reserve_deadline(past))
            .collect::<Vec<_>>(),
    )
    .await;
    run_ok(&db.url, &["once"]);
    #[derive(diesel::QueryableByName)]
    struct Header {
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        traceparent: Option<String>,
    }
    use diesel_async::RunQueryDsl;
    let mut conn = db.conn().await;
    let rows: Vec<Header> = diesel::sql_query(
        "SELECT headers->>'traceparent' AS traceparent FROM booking_expiration_outbox",
    )
    .load(&mut conn)
    .await
    .unwrap();
    assert_eq!(rows.len(), 3);
    let traces: BTreeSet<String> = rows
        .iter()
        .map(|r| {
            let t = r
                .traceparent
                .clone()
                .expect("traceparent in the stored headers");
            assert_eq!(t.len(), 55, "{t}");
            t[3..35].to_owned()
        })
        .collect();
    assert_eq!(traces.len(), 1, "one cycle, one trace");
    // A protocol this build cannot speak is a configuration error (exit 2).
    let output = binary()
        .arg("once")
        .env("DATABASE_URL", &db.url)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("OTEL_EXPORTER_OTLP_PROTOCOL"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
