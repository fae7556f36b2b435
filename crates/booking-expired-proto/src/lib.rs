//! The `pin.crm.booking-expired.v1` contract for consumers.
//!
//! Holds the protobuf types generated from `proto/` (package
//! `pin.crm.booking.v1`), the names of the Kafka headers the producer sets,
//! Kafka's Java-compatible keyed partitioner and a decoder that turns a
//! record's value and headers into a checked [`ReceivedEvent`]. It depends
//! on `prost` and `uuid` only, so consumers need none of the worker's
//! dependencies.
//!
//! ```
//! use booking_expired_proto::{decode_record, v1::Phase};
//! # let (value, headers) = booking_expired_proto::example_record();
//! let received = decode_record(&value, headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())))?;
//! assert_eq!(received.phase, Phase::Reserve);
//! println!("booking {} expired (event {})", received.booking_id, received.event_id);
//! # Ok::<(), booking_expired_proto::DecodeError>(())
//! ```

use prost::Message;
use uuid::Uuid;

/// Types generated from `proto/pin/crm/booking/v1/booking_expired.proto`.
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/pin.crm.booking.v1.rs"));
}

/// The topic the worker publishes to.
pub const TOPIC: &str = "pin.crm.booking-expired.v1";
/// `ContractVersion` of this package.
pub const CONTRACT_VERSION: u32 = 1;
/// `AggregateType` of every event.
pub const AGGREGATE_TYPE: &str = "Booking";
/// `ce_type` header value (equal to the topic).
pub const EVENT_TYPE: &str = TOPIC;
/// `content-type` header value.
pub const CONTENT_TYPE: &str = "application/protobuf";

/// Header names (CloudEvents 1.0 Kafka binary mode plus tracing headers).
pub mod headers {
    /// CloudEvents spec version, always `1.0`.
    pub const SPEC_VERSION: &str = "ce_specversion";
    /// Stable event id: equal across republishes, unique per event.
    pub const ID: &str = "ce_id";
    /// Producer identity (`/pin/crm/booking-expiration`).
    pub const SOURCE: &str = "ce_source";
    /// Event type, `pin.crm.booking-expired.v1`.
    pub const TYPE: &str = "ce_type";
    /// RFC 3339 time of the event (the booking's `expired_at`).
    pub const TIME: &str = "ce_time";
    /// `application/protobuf`.
    pub const CONTENT_TYPE: &str = "content-type";
    /// The worker cycle's run id.
    pub const CORRELATION_ID: &str = "correlation_id";
    /// The booking's tenant.
    pub const TENANT_ID: &str = "tenant_id";
    /// W3C Trace Context of the span that wrote the event (the expiry
    /// batch of the cycle, or the replay that re-enqueued it).
    pub const TRACEPARENT: &str = "traceparent";
    /// W3C Trace Context vendor state, only when the span has one.
    pub const TRACESTATE: &str = "tracestate";

    /// Every header name above (a record carries each at most once;
    /// `tracestate` only when the span has one).
    pub const ALL: [&str; 10] = [
        SPEC_VERSION,
        ID,
        SOURCE,
        TYPE,
        TIME,
        CONTENT_TYPE,
        CORRELATION_ID,
        TENANT_ID,
        TRACEPARENT,
        TRACESTATE,
    ];
}

/// Kafka's `Utils.murmur2` (seed `0x9747b28c`), bit for bit, as a signed
/// 32-bit value like the Java original.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = data.len();
    let mut h: u32 = SEED ^ (length as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    // Java falls through the cases 3 -> 2 -> 1.
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition the Java client's default partitioner picks for a keyed
/// record: `toPositive(murmur2(key)) % partitions`.
///
/// # Panics
/// When `partitions` is not positive: a topic always has one partition.
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    assert!(partitions > 0, "a topic has at least one partition");
    (murmur2(key) & 0x7fff_ffff) % partitions
}

/// Why a record is not a valid `BookingExpiredEvent`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The value is not a protobuf `BookingExpiredEvent`.
    Protobuf(String),
    /// A required header is missing.
    MissingHeader(&'static str),
    /// A header or field that must be a UUID is not one.
    InvalidUuid { field: &'static str, value: String },
    /// The phase is unspecified or unknown to this version.
    UnknownPhase(i32),
    /// `expired_at` is missing.
    MissingExpiredAt,
    /// The `ce_id` header and the payload's `event_id` name different
    /// events: the record was altered or assembled from two events, and
    /// deduplicating on either id would be wrong.
    EventIdMismatch { header: Uuid, payload: String },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Protobuf(e) => write!(f, "value is not a BookingExpiredEvent: {e}"),
            Self::MissingHeader(h) => write!(f, "header {h} is missing"),
            Self::InvalidUuid { field, value } => write!(f, "{field} is not a UUID: {value:?}"),
            Self::UnknownPhase(p) => write!(f, "phase {p} is not Reserve or Booking"),
            Self::MissingExpiredAt => write!(f, "expired_at is missing"),
            Self::EventIdMismatch { header, payload } => write!(
                f,
                "header ce_id {header} differs from the payload's event_id {payload:?}"
            ),
        }
    }
}

impl std::error::Error for DecodeError {}

/// A decoded, checked event with the headers a consumer needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedEvent {
    /// `ce_id`: deduplicate on it.
    pub event_id: Uuid,
    /// `correlation_id`: the producing cycle's run id.
    pub correlation_id: Uuid,
    pub tenant_id: Uuid,
    pub booking_id: Uuid,
    pub deal_id: Uuid,
    pub property_object_id: Uuid,
    pub phase: v1::Phase,
    /// `expired_at` as (seconds, nanos) since the Unix epoch.
    pub expired_at: prost_types::Timestamp,
    /// The raw message, for fields added later within v1.
    pub message: v1::BookingExpiredEvent,
}

fn parse_uuid(field: &'static str, value: &str) -> Result<Uuid, DecodeError> {
    Uuid::parse_str(value).map_err(|_| DecodeError::InvalidUuid {
        field,
        value: value.to_owned(),
    })
}

/// Decodes a record's value and headers.
pub fn decode_record<'a>(
    value: &[u8],
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Result<ReceivedEvent, DecodeError> {
    let message =
        v1::BookingExpiredEvent::decode(value).map_err(|e| DecodeError::Protobuf(e.to_string()))?;
    let mut ce_id = None;
    let mut correlation_id = None;
    for (name, bytes) in headers {
        let text = String::from_utf8_lossy(bytes);
        match name {
            headers::ID => ce_id = Some(parse_uuid(headers::ID, &text)?),
            headers::CORRELATION_ID => {
                correlation_id = Some(parse_uuid(headers::CORRELATION_ID, &text)?)
            }
            _ => {}
        }
    }
    let event_id = ce_id.ok_or(DecodeError::MissingHeader(headers::ID))?;
    if parse_uuid("event_id", &message.event_id).ok() != Some(event_id) {
        return Err(DecodeError::EventIdMismatch {
            header: event_id,
            payload: message.event_id,
        });
    }
    let phase = match v1::Phase::try_from(message.phase) {
        Ok(p @ (v1::Phase::Reserve | v1::Phase::Booking)) => p,
        _ => return Err(DecodeError::UnknownPhase(message.phase)),
    };
    Ok(ReceivedEvent {
        event_id,
        correlation_id: correlation_id
            .ok_or(DecodeError::MissingHeader(headers::CORRELATION_ID))?,
        tenant_id: parse_uuid("tenant_id", &message.tenant_id)?,
        booking_id: parse_uuid("booking_id", &message.booking_id)?,
        deal_id: parse_uuid("deal_id", &message.deal_id)?,
        property_object_id: parse_uuid("property_object_id", &message.property_object_id)?,
        phase,
        expired_at: message.expired_at.ok_or(DecodeError::MissingExpiredAt)?,
        message,
    })
}

/// A sample record (value, headers) for documentation examples.
#[doc(hidden)]
pub fn example_record() -> (Vec<u8>, Vec<(String, Vec<u8>)>) {
    let event_id = "5f0c6d2e-8f7a-4a7e-9d8c-1b2a3c4d5e6f";
    let correlation_id = "0b8a2c44-1d7e-4f5a-8a9b-6c7d8e9f0a1b";
    let message = v1::BookingExpiredEvent {
        booking_id: "3d8f2a10-5b6c-4d7e-8f90-a1b2c3d4e5f6".into(),
        tenant_id: "7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d".into(),
        deal_id: "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d".into(),
        property_object_id: "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a".into(),
        phase: v1::Phase::Reserve as i32,
        expired_at: Some(prost_types::Timestamp {
            seconds: 1_800_000_000,
            nanos: 0,
        }),
        event_id: event_id.into(),
        correlation_id: correlation_id.into(),
        contract_version: CONTRACT_VERSION,
        aggregate_type: AGGREGATE_TYPE.into(),
    };
    let headers = vec![
        (headers::ID.to_owned(), event_id.as_bytes().to_vec()),
        (
            headers::CORRELATION_ID.to_owned(),
            correlation_id.as_bytes().to_vec(),
        ),
    ];
    (message.encode_to_vec(), headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors from Apache Kafka's `UtilsTest.testMurmur2`.
    #[test]
    fn murmur2_matches_kafka_vectors() {
        let cases: [(&str, i32); 6] = [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            ("abc", 479_470_107),
        ];
        for (input, expected) in cases {
            assert_eq!(murmur2(input.as_bytes()), expected, "murmur2({input:?})");
        }
    }

    #[test]
    fn partition_is_never_negative() {
        // "21" hashes to a negative value: the sign bit must be masked, not abs()'d.
        let p = partition_for_key(b"21", 3);
        assert_eq!(p, ((-973_932_308_i32) & 0x7fff_ffff) % 3);
        for n in 1..50 {
            for key in ["", "a", "ab", "abc", "abcd", "21", "foobar"] {
                let p = partition_for_key(key.as_bytes(), n);
                assert!((0..n).contains(&p));
            }
        }
    }

    #[test]
    fn decodes_example_record() {
        let (value, headers) = example_record();
        let received = decode_record(
            &value,
            headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())),
        )
        .expect("valid record");
        assert_eq!(received.phase, v1::Phase::Reserve);
        assert_eq!(received.message.contract_version, CONTRACT_VERSION);
    }

    #[test]
    fn rejects_a_ce_id_that_differs_from_the_payload_event_id() {
        let (value, mut headers) = example_record();
        let other = "00000000-0000-4000-8000-000000000001";
        headers[0].1 = other.as_bytes().to_vec();
        let error = decode_record(
            &value,
            headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())),
        )
        .expect_err("mismatched ids");
        assert_eq!(
            error,
            DecodeError::EventIdMismatch {
                header: Uuid::parse_str(other).expect("uuid"),
                payload: "5f0c6d2e-8f7a-4a7e-9d8c-1b2a3c4d5e6f".into(),
            }
        );
        // The same id in another spelling is the same event.
        headers[0].1 = b"5F0C6D2E-8F7A-4A7E-9D8C-1B2A3C4D5E6F".to_vec();
        assert!(
            decode_record(
                &value,
                headers.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
            )
            .is_ok()
        );
    }

    /// The crate builds from its own copy of the contract (so it can be
    /// packaged); inside the repository that copy must equal `proto/`.
    #[test]
    fn packaged_proto_equals_the_contract() {
        let path = "pin/crm/booking/v1/booking_expired.proto";
        let crate_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let contract = crate_dir.join("../../proto").join(path);
        let Ok(contract) = std::fs::read_to_string(&contract) else {
            return; // a packaged crate, outside the repository
        };
        let copy = std::fs::read_to_string(crate_dir.join("proto").join(path))
            .expect("the crate's proto copy");
        assert_eq!(
            copy, contract,
            "crates/booking-expired-proto/proto/{path} differs from proto/{path}: copy it over"
        );
    }

    #[test]
    fn rejects_missing_ce_id_and_garbage() {
        let (value, _) = example_record();
        assert_eq!(
            decode_record(&value, std::iter::empty()),
            Err(DecodeError::MissingHeader(headers::ID))
        );
        assert!(matches!(
            decode_record(&[0xff, 0xff, 0xff], std::iter::empty()),
            Err(DecodeError::Protobuf(_))
        ));
    }
}
