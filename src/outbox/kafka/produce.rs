//! A produce request as the worker sends it, on rskafka's protocol types:
//! one record batch for one partition, `acks = all`, the records' create
//! time stamped when the request is built; and what its answer says.
//!
//! The batch is the one rskafka's `PartitionClient` built (magic 2, no
//! producer id, no transaction, offsets and timestamps as deltas), so the
//! bytes on the topic are what they were: key, value and headers (sorted
//! by name) as the outbox row holds them.

use chrono::{DateTime, Utc};
use rskafka::protocol::{
    messages::{
        ProduceRequest, ProduceRequestPartitionData, ProduceRequestTopicData, ProduceResponse,
    },
    primitives::{Int16, Int32, NullableString, Records, String_},
    record::{
        ControlBatchOrRecords, Record, RecordBatch, RecordBatchCompression,
        RecordBatchTimestampType, RecordHeader,
    },
};

use super::KafkaError;
use crate::{config::Compression, outbox::transport::OutgoingRecord};

/// How long the broker waits for the in-sync replicas before it answers
/// `REQUEST_TIMED_OUT` (the field of the request). Shorter than
/// `KAFKA_REQUEST_TIMEOUT`'s default (35 s), so a live broker that waits
/// for a slow follower answers before this side gives up.
pub(super) const BROKER_TIMEOUT_MS: i32 = 30_000;

/// `acks = all`: the leader answers once every in-sync replica has the
/// records.
const ACKS_ALL: i16 = -1;

/// The request for `records` to `partition` of `topic`, stamped `now`.
/// `records` is not empty.
pub(super) fn request(
    topic: &str,
    partition: i32,
    records: Vec<OutgoingRecord>,
    compression: Compression,
    now: DateTime<Utc>,
) -> ProduceRequest {
    let timestamp = now.timestamp_millis();
    let last_offset_delta = i32::try_from(records.len()).unwrap_or(i32::MAX) - 1;
    let records = records
        .into_iter()
        .enumerate()
        .map(|(offset_delta, record)| Record {
            key: Some(record.key.into_bytes()),
            value: Some(record.value),
            timestamp_delta: 0,
            offset_delta: i32::try_from(offset_delta).unwrap_or(i32::MAX),
            // In name order, one value per name (as rskafka's header map
            // wrote them).
            headers: record
                .headers
                .into_pairs()
                .map(|(key, value)| RecordHeader {
                    key,
                    value: value.into_bytes(),
                })
                .collect(),
        })
        .collect();
    ProduceRequest {
        transactional_id: NullableString(None),
        acks: Int16(ACKS_ALL),
        timeout_ms: Int32(BROKER_TIMEOUT_MS),
        topic_data: vec![ProduceRequestTopicData {
            name: String_(topic.to_owned()),
            partition_data: vec![ProduceRequestPartitionData {
                index: Int32(partition),
                records: Records(vec![RecordBatch {
                    base_offset: 0,
                    partition_leader_epoch: 0,
                    last_offset_delta,
                    first_timestamp: timestamp,
                    max_timestamp: timestamp,
                    producer_id: -1,
                    producer_epoch: -1,
                    base_sequence: -1,
                    records: ControlBatchOrRecords::Records(records),
                    compression: batch_compression(compression),
                    is_transactional: false,
                    timestamp_type: RecordBatchTimestampType::CreateTime,
                }]),
            }],
        }],
    }
}

fn batch_compression(compression: Compression) -> RecordBatchCompression {
    match compression {
        Compression::None => RecordBatchCompression::NoCompression,
        Compression::Gzip => RecordBatchCompression::Gzip,
        Compression::Snappy => RecordBatchCompression::Snappy,
        #[cfg(feature = "kafka-lz4")]
        Compression::Lz4 => RecordBatchCompression::Lz4,
        #[cfg(feature = "kafka-zstd")]
        Compression::Zstd => RecordBatchCompression::Zstd,
    }
}

/// What the answer says of the one partition the request carried: every
/// record appended (`Ok`), or the broker's error code.
pub(super) fn outcome(
    response: &ProduceResponse,
    topic: &str,
    partition: i32,
    broker: &str,
) -> Result<(), KafkaError> {
    let unexpected = |what: String| KafkaError::Unexpected {
        operation: "produce",
        broker: broker.to_owned(),
        what,
    };
    let mut answers = response
        .responses
        .iter()
        .filter(|t| t.name.0 == topic)
        .flat_map(|t| &t.partition_responses)
        .filter(|p| p.index.0 == partition);
    let answer = answers
        .next()
        .ok_or_else(|| unexpected(format!("no answer for partition {partition} of {topic:?}")))?;
    if answers.next().is_some() {
        return Err(unexpected(format!(
            "two answers for partition {partition} of {topic:?}"
        )));
    }
    match answer.error {
        None => Ok(()),
        Some(error) => Err(KafkaError::Broker {
            operation: "produce",
            error,
            message: None,
        }),
    }
}

/// The hold a throttled answer asks for (KIP-219), if any.
pub(super) fn throttle(response: &ProduceResponse) -> Option<std::time::Duration> {
    let ms = response.throttle_time_ms?.0;
    (ms > 0).then(|| std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}
