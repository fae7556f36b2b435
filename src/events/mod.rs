//! From domain events to integration messages: the protobuf value, the
//! Kafka key and the CloudEvents headers, fixed when the outbox row is
//! written so every republish sends identical bytes.

mod headers_map;

use booking_expired_proto::{self as contract, headers, v1};
use chrono::{DateTime, SecondsFormat, Utc};
use prost::Message;
use uuid::Uuid;

pub use headers_map::Headers;

use crate::domain::{BookingExpired, Phase, RunId};

/// Namespace of event ids (UUIDv5 of booking id and version), so the same
/// transition always has the same id.
const EVENT_ID_NAMESPACE: Uuid = Uuid::from_u128(0x6c1f_3b1e_9a52_4d0b_8c43_2f7e_5d9a_0b11);

/// One message ready for the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    pub event_id: Uuid,
    pub tenant_id: Uuid,
    /// The booking id, canonical lowercase hyphenated.
    pub key: String,
    /// The key's partition hash ([`key_hash`]), computed once here: the
    /// outbox column, the rows handed to the publisher and the routing to
    /// a partition all take it from the message.
    pub key_hash: i32,
    /// Encoded `BookingExpiredEvent`.
    pub payload: Vec<u8>,
    /// The record headers (CloudEvents, correlation, tenant, trace).
    pub headers: Headers,
}

/// The W3C Trace Context of the span that writes a message: the
/// `traceparent` and `tracestate` record headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceHeaders {
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

/// Whether a header is trace context (the only headers a replay does not
/// reproduce: it carries the replay's own).
pub fn is_trace_header(name: &str) -> bool {
    name == headers::TRACEPARENT || name == headers::TRACESTATE
}

/// The key's partition hash: the Java client's `murmur2(key) & 0x7fffffff`,
/// so `key_hash % partitions` is the record's partition
/// (`booking_expired_proto::partition_for_key`). Stored with the outbox
/// row, so a claim can leave out the rows of partitions that cannot take
/// more, and carried with the row, so the publisher routes it without
/// hashing the key again.
pub fn key_hash(key: &str) -> i32 {
    contract::murmur2(key.as_bytes()) & 0x7fff_ffff
}

/// The stable id of the event for one transition.
pub fn event_id(event: &BookingExpired) -> Uuid {
    let mut name = [0u8; 24];
    name[..16].copy_from_slice(event.booking_id.as_uuid().as_bytes());
    name[16..].copy_from_slice(&event.version.to_be_bytes());
    Uuid::new_v5(&EVENT_ID_NAMESPACE, &name)
}

fn phase_to_proto(phase: Phase) -> v1::Phase {
    match phase {
        Phase::Reserve => v1::Phase::Reserve,
        Phase::Booking => v1::Phase::Booking,
    }
}

fn timestamp(at: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: at.timestamp(),
        // Always below 10^9 for a valid DateTime (leap seconds aside).
        nanos: i32::try_from(at.timestamp_subsec_nanos().min(999_999_999)).unwrap_or(0),
    }
}

/// The protobuf value of an event.
pub fn to_proto(event: &BookingExpired, event_id: Uuid, run_id: RunId) -> v1::BookingExpiredEvent {
    v1::BookingExpiredEvent {
        booking_id: event.booking_id.to_string(),
        tenant_id: event.tenant_id.to_string(),
        deal_id: event.deal_id.to_string(),
        property_object_id: event.property_object_id.to_string(),
        phase: phase_to_proto(event.phase) as i32,
        expired_at: Some(timestamp(event.expired_at)),
        event_id: event_id.hyphenated().to_string(),
        correlation_id: run_id.to_string(),
        contract_version: contract::CONTRACT_VERSION,
        aggregate_type: contract::AGGREGATE_TYPE.to_owned(),
    }
}

/// Builds the outbox message of an event: key, value and headers. The one
/// builder of both the expiring cycle and `republish`, so a replayed event
/// is the original byte for byte (trace context aside).
pub fn outbox_message(
    event: &BookingExpired,
    run_id: RunId,
    source: &str,
    trace: &TraceHeaders,
) -> OutboxMessage {
    let event_id = event_id(event);
    let payload = to_proto(event, event_id, run_id).encode_to_vec();
    let mut headers = Headers::from_static([
        (headers::SPEC_VERSION, "1.0".to_owned()),
        (headers::ID, event_id.hyphenated().to_string()),
        (headers::SOURCE, source.to_owned()),
        (headers::TYPE, contract::EVENT_TYPE.to_owned()),
        (
            headers::TIME,
            event
                .expired_at
                .to_rfc3339_opts(SecondsFormat::Micros, true),
        ),
        (headers::CONTENT_TYPE, contract::CONTENT_TYPE.to_owned()),
        (headers::CORRELATION_ID, run_id.to_string()),
        (headers::TENANT_ID, event.tenant_id.to_string()),
    ]);
    if let Some(traceparent) = &trace.traceparent {
        headers.insert(headers::TRACEPARENT, traceparent.clone());
    }
    if let Some(tracestate) = &trace.tracestate {
        headers.insert(headers::TRACESTATE, tracestate.clone());
    }
    let key = event.booking_id.to_string();
    OutboxMessage {
        event_id,
        tenant_id: event.tenant_id.as_uuid(),
        key_hash: key_hash(&key),
        key,
        payload,
        headers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::defaults::CE_SOURCE;
    use crate::domain::{BookingId, DealId, PropertyObjectId, Status, TenantId};
    use booking_expired_proto::decode_record;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn event(seed: u128, phase: Phase, seconds: i64, nanos: u32, version: i64) -> BookingExpired {
        BookingExpired {
            booking_id: BookingId::new(Uuid::from_u128(seed)),
            tenant_id: TenantId::new(Uuid::from_u128(seed ^ 0xaaaa)),
            deal_id: DealId::new(Uuid::from_u128(seed ^ 0xbbbb)),
            property_object_id: PropertyObjectId::new(Uuid::from_u128(seed ^ 0xcccc)),
            phase,
            from_status: phase.active_statuses()[0],
            to_status: phase.target_status(),
            deadline: Utc.timestamp_opt(seconds - 1, nanos).single().unwrap(),
            expired_at: Utc.timestamp_opt(seconds, nanos).single().unwrap(),
            version,
        }
    }

    #[test]
    fn headers_follow_the_contract() {
        let run_id = RunId::new(Uuid::from_u128(99));
        let e = event(1, Phase::Booking, 1_800_000_000, 5_000, 3);
        let trace = TraceHeaders {
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned()),
            tracestate: Some("congo=t61rcWkgMzE".to_owned()),
        };
        let message = outbox_message(&e, run_id, CE_SOURCE, &trace);
        let get = |name: &str| message.headers.get(name);
        assert_eq!(get("ce_specversion"), Some("1.0"));
        assert_eq!(get("ce_type"), Some("pin.crm.booking-expired.v1"));
        assert_eq!(get("content-type"), Some("application/protobuf"));
        assert_eq!(get("ce_source"), Some(CE_SOURCE));
        assert_eq!(get("ce_time"), Some("2027-01-15T08:00:00.000005Z"));
        assert_eq!(get("ce_id"), Some(message.event_id.to_string().as_str()));
        assert_eq!(get("correlation_id"), Some(run_id.to_string().as_str()));
        assert_eq!(get("tenant_id"), Some(e.tenant_id.to_string().as_str()));
        assert_eq!(get("traceparent"), trace.traceparent.as_deref());
        assert_eq!(get("tracestate"), trace.tracestate.as_deref());
        let names: Vec<&str> = message.headers.iter().map(|(name, _)| name).collect();
        let mut all = headers::ALL.to_vec();
        all.sort_unstable();
        assert_eq!(names, all, "the contract's list names every header, once");
        let untraced = outbox_message(&e, run_id, CE_SOURCE, &TraceHeaders::default());
        assert_eq!(
            untraced.headers,
            message.headers.without(is_trace_header),
            "trace context is the only difference"
        );
        assert_eq!(
            (untraced.key, untraced.payload),
            (message.key.clone(), message.payload.clone())
        );
        assert_eq!(message.key, "00000000-0000-0000-0000-000000000001");
        assert_eq!(Status::BookingExpired, e.to_status);
    }

    #[test]
    fn key_hash_is_the_java_partitioners_positive_murmur2() {
        for key in ["21", "foobar", "00000000-0000-0000-0000-000000000001", ""] {
            let hash = key_hash(key);
            assert!(hash >= 0);
            for partitions in [1, 3, 7, 12] {
                assert_eq!(
                    hash % partitions,
                    booking_expired_proto::partition_for_key(key.as_bytes(), partitions),
                    "{key} over {partitions}"
                );
            }
        }
        let message = outbox_message(
            &event(1, Phase::Booking, 0, 0, 1),
            RunId::generate(),
            CE_SOURCE,
            &TraceHeaders::default(),
        );
        assert_eq!(message.key_hash, key_hash(&message.key));
    }

    #[test]
    fn event_id_is_stable_and_unique_per_transition() {
        let a = event(1, Phase::Reserve, 0, 0, 2);
        assert_eq!(event_id(&a), event_id(&a.clone()));
        assert_ne!(event_id(&a), event_id(&event(1, Phase::Reserve, 0, 0, 3)));
        assert_ne!(event_id(&a), event_id(&event(2, Phase::Reserve, 0, 0, 2)));
    }

    proptest! {
        /// What the worker encodes, a consumer decodes to the same facts.
        #[test]
        fn protobuf_round_trip(
            seed in any::<u128>(),
            booking_phase in any::<bool>(),
            seconds in 0i64..4_000_000_000,
            nanos in 0u32..1_000_000_000,
            version in 1i64..i64::MAX,
            run in any::<u128>(),
        ) {
            let phase = if booking_phase { Phase::Booking } else { Phase::Reserve };
            let e = event(seed, phase, seconds, nanos, version);
            let run_id = RunId::new(Uuid::from_u128(run));
            let message = outbox_message(&e, run_id, CE_SOURCE, &TraceHeaders::default());
            let received = decode_record(
                &message.payload,
                message.headers.iter().map(|(k, v)| (k, v.as_bytes())),
            ).unwrap();
            prop_assert_eq!(received.booking_id, e.booking_id.as_uuid());
            prop_assert_eq!(received.tenant_id, e.tenant_id.as_uuid());
            prop_assert_eq!(received.deal_id, e.deal_id.as_uuid());
            prop_assert_eq!(received.property_object_id, e.property_object_id.as_uuid());
            prop_assert_eq!(received.phase, phase_to_proto(phase));
            prop_assert_eq!(received.event_id, message.event_id);
            prop_assert_eq!(received.correlation_id, run_id.as_uuid());
            prop_assert_eq!(received.expired_at.seconds, seconds);
            prop_assert_eq!(received.expired_at.nanos as u32, nanos);
            prop_assert_eq!(received.message.contract_version, 1);
            prop_assert_eq!(received.message.aggregate_type.as_str(), "Booking");
        }
    }
}
