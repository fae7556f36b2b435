//! A fresh Kafka topic per test on the test broker, reading a topic back,
//! and the partitions Kafka's Java client computes (all via `testkit`).

use std::collections::BTreeMap;

pub use testkit::kafka::ConsumedRecord;
use uuid::Uuid;

use super::kafka_bootstrap;

/// Creates a fresh topic with `partitions` partitions and returns its name.
pub async fn create_topic(partitions: i32) -> String {
    let name = format!("test-booking-expired-{}", Uuid::new_v4().simple());
    testkit::kafka::create_topic(kafka_bootstrap(), &name, partitions)
        .await
        .expect("create topic");
    name
}

/// Reads every record of every partition of `topic` (up to the high watermark).
pub async fn read_topic(topic: &str, partitions: i32) -> Vec<ConsumedRecord> {
    read_topic_from(kafka_bootstrap(), topic, partitions).await
}

/// [`read_topic`] on another broker.
pub async fn read_topic_from(
    bootstrap: Vec<String>,
    topic: &str,
    partitions: i32,
) -> Vec<ConsumedRecord> {
    testkit::kafka::read_topic(bootstrap, topic, partitions)
        .await
        .unwrap_or_else(|e| panic!("read {topic}: {e:#}"))
}

/// The partitions the Java client computes for `keys`, by running Kafka's
/// own `Utils.murmur2` from the broker's jars (scripts/kafka.sh partition).
pub fn java_partitions(keys: &[String], partitions: i32) -> BTreeMap<String, i32> {
    testkit::kafka::java_partitions(keys, partitions).unwrap_or_else(|e| panic!("{e:#}"))
}
