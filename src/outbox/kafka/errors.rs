//! Kafka's error codes as Kafka classifies them, and what the publisher
//! does with each: the table below is every code of Kafka's protocol
//! (`org.apache.kafka.common.protocol.Errors`, codes -1 to 128), each with
//! the exception the Java client raises for it and its [`ErrorClass`]. A
//! code missing from the table (one newer than it) is what the Java client
//! makes of an unknown code: `UNKNOWN_SERVER_ERROR`, not retriable.
//!
//! - [`ErrorClass::Retriable`]: the Java client's retriable codes (its
//!   exception is a `RetriableException`, directly or through
//!   `InvalidMetadataException`), but one. The partition backs off on its
//!   own (100 ms doubling to 800 ms) and sends the same records again; a
//!   code that puts the leader in doubt has it looked up again first.
//! - [`ErrorClass::Refused`]: the broker will never accept this record as
//!   it is: too large (`MESSAGE_TOO_LARGE`, `RECORD_LIST_TOO_LARGE`, once a
//!   request was split down to the one record), refused for its content
//!   (`INVALID_RECORD`), or corrupt (`CORRUPT_MESSAGE`: a CRC that did not
//!   match). A refused request of several records is split and sent again,
//!   so a CRC flipped on the way passes on the resend; a record refused on
//!   its own is parked, so the rows behind it go on, and `outbox retry`
//!   puts it back. `CORRUPT_MESSAGE` is the one code the Java client
//!   retries that is not retried here forever: Java gives up on it at
//!   `delivery.timeout.ms`, and a record that fails its check alone every
//!   time would otherwise hold its partition for good. `INVALID_TIMESTAMP`
//!   does not park: the record's timestamp is the time its request is
//!   built, so the broker refusing it says the clocks (or the topic's
//!   `message.timestamp.*.max.ms`) are wrong for every record.
//! - [`ErrorClass::Fatal`]: every other code that is not retriable. They
//!   are about this client (authorisation, SASL, an unsupported version
//!   or compression, a bad request) or the cluster, not about a record:
//!   parking would park every record. The partition (or the topic, when
//!   its metadata says so) pauses for `Timing::fatal_pause` with its rows
//!   waiting, `/readyz` fails and the log says why once a minute until an
//!   operator fixes it; no new connection is opened for it.
//!
//! The test checks the table against rskafka's own names for the codes,
//! and the retriable set against a list written from the Java sources.

use std::time::Duration;

use rskafka::{
    client::error::ProtocolError,
    messenger::{RequestError, SyncVersionsError},
};

use super::security::SecurityError;
use crate::outbox::transport::{ErrorClass, SendError};

use ErrorClass::{Fatal, Refused, Retriable};

/// One Kafka error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode {
    pub code: i16,
    /// Kafka's name (`Errors.java`).
    pub name: &'static str,
    /// The exception the Java client raises for it.
    pub java_exception: &'static str,
    /// What the publisher does with it (see the module docs).
    pub class: ErrorClass,
}

const fn row(
    code: i16,
    name: &'static str,
    java_exception: &'static str,
    class: ErrorClass,
) -> ErrorCode {
    ErrorCode {
        code,
        name,
        java_exception,
        class,
    }
}

/// Every code of Kafka's protocol, in order (Apache Kafka's
/// `clients/src/main/java/org/apache/kafka/common/protocol/Errors.java`
/// and the class hierarchy of `org.apache.kafka.common.errors`).
#[rustfmt::skip]
pub const ERROR_CODES: &[ErrorCode] = &[
    row(-1, "UNKNOWN_SERVER_ERROR", "UnknownServerException", Fatal),
    row(1, "OFFSET_OUT_OF_RANGE", "OffsetOutOfRangeException", Fatal),
    row(2, "CORRUPT_MESSAGE", "CorruptRecordException", Refused),
    row(3, "UNKNOWN_TOPIC_OR_PARTITION", "UnknownTopicOrPartitionException", Retriable),
    row(4, "INVALID_FETCH_SIZE", "InvalidFetchSizeException", Fatal),
    row(5, "LEADER_NOT_AVAILABLE", "LeaderNotAvailableException", Retriable),
    row(6, "NOT_LEADER_OR_FOLLOWER", "NotLeaderOrFollowerException", Retriable),
    row(7, "REQUEST_TIMED_OUT", "TimeoutException", Retriable),
    row(8, "BROKER_NOT_AVAILABLE", "BrokerNotAvailableException", Fatal),
    row(9, "REPLICA_NOT_AVAILABLE", "ReplicaNotAvailableException", Retriable),
    row(10, "MESSAGE_TOO_LARGE", "RecordTooLargeException", Refused),
    row(11, "STALE_CONTROLLER_EPOCH", "ControllerMovedException", Fatal),
    row(12, "OFFSET_METADATA_TOO_LARGE", "OffsetMetadataTooLarge", Fatal),
    row(13, "NETWORK_EXCEPTION", "NetworkException", Retriable),
    row(14, "COORDINATOR_LOAD_IN_PROGRESS", "CoordinatorLoadInProgressException", Retriable),
    row(15, "COORDINATOR_NOT_AVAILABLE", "CoordinatorNotAvailableException", Retriable),
    row(16, "NOT_COORDINATOR", "NotCoordinatorException", Retriable),
    row(17, "INVALID_TOPIC_EXCEPTION", "InvalidTopicException", Fatal),
    row(18, "RECORD_LIST_TOO_LARGE", "RecordBatchTooLargeException", Refused),
    row(19, "NOT_ENOUGH_REPLICAS", "NotEnoughReplicasException", Retriable),
    row(20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "NotEnoughReplicasAfterAppendException", Retriable),
    row(21, "INVALID_REQUIRED_ACKS", "InvalidRequiredAcksException", Fatal),
    row(22, "ILLEGAL_GENERATION", "IllegalGenerationException", Fatal),
    row(23, "INCONSISTENT_GROUP_PROTOCOL", "InconsistentGroupProtocolException", Fatal),
    row(24, "INVALID_GROUP_ID", "InvalidGroupIdException", Fatal),
    row(25, "UNKNOWN_MEMBER_ID", "UnknownMemberIdException", Fatal),
    row(26, "INVALID_SESSION_TIMEOUT", "InvalidSessionTimeoutException", Fatal),
    row(27, "REBALANCE_IN_PROGRESS", "RebalanceInProgressException", Fatal),
    row(28, "INVALID_COMMIT_OFFSET_SIZE", "InvalidCommitOffsetSizeException", Fatal),
    row(29, "TOPIC_AUTHORIZATION_FAILED", "TopicAuthorizationException", Fatal),
    row(30, "GROUP_AUTHORIZATION_FAILED", "GroupAuthorizationException", Fatal),
    row(31, "CLUSTER_AUTHORIZATION_FAILED", "ClusterAuthorizationException", Fatal),
    row(32, "INVALID_TIMESTAMP", "InvalidTimestampException", Fatal),
    row(33, "UNSUPPORTED_SASL_MECHANISM", "UnsupportedSaslMechanismException", Fatal),
    row(34, "ILLEGAL_SASL_STATE", "IllegalSaslStateException", Fatal),
    row(35, "UNSUPPORTED_VERSION", "UnsupportedVersionException", Fatal),
    row(36, "TOPIC_ALREADY_EXISTS", "TopicExistsException", Fatal),
    row(37, "INVALID_PARTITIONS", "InvalidPartitionsException", Fatal),
    row(38, "INVALID_REPLICATION_FACTOR", "InvalidReplicationFactorException", Fatal),
    row(39, "INVALID_REPLICA_ASSIGNMENT", "InvalidReplicaAssignmentException", Fatal),
    row(40, "INVALID_CONFIG", "InvalidConfigurationException", Fatal),
    row(41, "NOT_CONTROLLER", "NotControllerException", Retriable),
    row(42, "INVALID_REQUEST", "InvalidRequestException", Fatal),
    row(43, "UNSUPPORTED_FOR_MESSAGE_FORMAT", "UnsupportedForMessageFormatException", Fatal),
    row(44, "POLICY_VIOLATION", "PolicyViolationException", Fatal),
    row(45, "OUT_OF_ORDER_SEQUENCE_NUMBER", "OutOfOrderSequenceException", Fatal),
    row(46, "DUPLICATE_SEQUENCE_NUMBER", "DuplicateSequenceException", Fatal),
    row(47, "INVALID_PRODUCER_EPOCH", "InvalidProducerEpochException", Fatal),
    row(48, "INVALID_TXN_STATE", "InvalidTxnStateException", Fatal),
    row(49, "INVALID_PRODUCER_ID_MAPPING", "InvalidPidMappingException", Fatal),
    row(50, "INVALID_TRANSACTION_TIMEOUT", "InvalidTxnTimeoutException", Fatal),
    row(51, "CONCURRENT_TRANSACTIONS", "ConcurrentTransactionsException", Retriable),
    row(52, "TRANSACTION_COORDINATOR_FENCED", "TransactionCoordinatorFencedException", Fatal),
    row(53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "TransactionalIdAuthorizationException", Fatal),
    row(54, "SECURITY_DISABLED", "SecurityDisabledException", Fatal),
    row(55, "OPERATION_NOT_ATTEMPTED", "OperationNotAttemptedException", Fatal),
    row(56, "KAFKA_STORAGE_ERROR", "KafkaStorageException", Retriable),
    row(57, "LOG_DIR_NOT_FOUND", "LogDirNotFoundException", Fatal),
    row(58, "SASL_AUTHENTICATION_FAILED", "SaslAuthenticationException", Fatal),
    row(59, "UNKNOWN_PRODUCER_ID", "UnknownProducerIdException", Fatal),
    row(60, "REASSIGNMENT_IN_PROGRESS", "ReassignmentInProgressException", Fatal),
    row(61, "DELEGATION_TOKEN_AUTH_DISABLED", "DelegationTokenDisabledException", Fatal),
    row(62, "DELEGATION_TOKEN_NOT_FOUND", "DelegationTokenNotFoundException", Fatal),
    row(63, "DELEGATION_TOKEN_OWNER_MISMATCH", "DelegationTokenOwnerMismatchException", Fatal),
    row(64, "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED", "UnsupportedByAuthenticationException", Fatal),
    row(65, "DELEGATION_TOKEN_AUTHORIZATION_FAILED", "DelegationTokenAuthorizationException", Fatal),
    row(66, "DELEGATION_TOKEN_EXPIRED", "DelegationTokenExpiredException", Fatal),
    row(67, "INVALID_PRINCIPAL_TYPE", "InvalidPrincipalTypeException", Fatal),
    row(68, "NON_EMPTY_GROUP", "GroupNotEmptyException", Fatal),
    row(69, "GROUP_ID_NOT_FOUND", "GroupIdNotFoundException", Fatal),
    row(70, "FETCH_SESSION_ID_NOT_FOUND", "FetchSessionIdNotFoundException", Retriable),
    row(71, "INVALID_FETCH_SESSION_EPOCH", "InvalidFetchSessionEpochException", Retriable),
    row(72, "LISTENER_NOT_FOUND", "ListenerNotFoundException", Retriable),
    row(73, "TOPIC_DELETION_DISABLED", "TopicDeletionDisabledException", Fatal),
    row(74, "FENCED_LEADER_EPOCH", "FencedLeaderEpochException", Retriable),
    row(75, "UNKNOWN_LEADER_EPOCH", "UnknownLeaderEpochException", Retriable),
    row(76, "UNSUPPORTED_COMPRESSION_TYPE", "UnsupportedCompressionTypeException", Fatal),
    row(77, "STALE_BROKER_EPOCH", "StaleBrokerEpochException", Fatal),
    row(78, "OFFSET_NOT_AVAILABLE", "OffsetNotAvailableException", Retriable),
    row(79, "MEMBER_ID_REQUIRED", "MemberIdRequiredException", Fatal),
    row(80, "PREFERRED_LEADER_NOT_AVAILABLE", "PreferredLeaderNotAvailableException", Retriable),
    row(81, "GROUP_MAX_SIZE_REACHED", "GroupMaxSizeReachedException", Fatal),
    row(82, "FENCED_INSTANCE_ID", "FencedInstanceIdException", Fatal),
    row(83, "ELIGIBLE_LEADERS_NOT_AVAILABLE", "EligibleLeadersNotAvailableException", Retriable),
    row(84, "ELECTION_NOT_NEEDED", "ElectionNotNeededException", Retriable),
    row(85, "NO_REASSIGNMENT_IN_PROGRESS", "NoReassignmentInProgressException", Fatal),
    row(86, "GROUP_SUBSCRIBED_TO_TOPIC", "GroupSubscribedToTopicException", Fatal),
    row(87, "INVALID_RECORD", "InvalidRecordException", Refused),
    row(88, "UNSTABLE_OFFSET_COMMIT", "UnstableOffsetCommitException", Retriable),
    row(89, "THROTTLING_QUOTA_EXCEEDED", "ThrottlingQuotaExceededException", Retriable),
    row(90, "PRODUCER_FENCED", "ProducerFencedException", Fatal),
    row(91, "RESOURCE_NOT_FOUND", "ResourceNotFoundException", Fatal),
    row(92, "DUPLICATE_RESOURCE", "DuplicateResourceException", Fatal),
    row(93, "UNACCEPTABLE_CREDENTIAL", "UnacceptableCredentialException", Fatal),
    row(94, "INCONSISTENT_VOTER_SET", "InconsistentVoterSetException", Fatal),
    row(95, "INVALID_UPDATE_VERSION", "InvalidUpdateVersionException", Fatal),
    row(96, "FEATURE_UPDATE_FAILED", "FeatureUpdateFailedException", Fatal),
    row(97, "PRINCIPAL_DESERIALIZATION_FAILURE", "PrincipalDeserializationException", Fatal),
    row(98, "SNAPSHOT_NOT_FOUND", "SnapshotNotFoundException", Fatal),
    row(99, "POSITION_OUT_OF_RANGE", "PositionOutOfRangeException", Fatal),
    row(100, "UNKNOWN_TOPIC_ID", "UnknownTopicIdException", Retriable),
    row(101, "DUPLICATE_BROKER_REGISTRATION", "DuplicateBrokerRegistrationException", Fatal),
    row(102, "BROKER_ID_NOT_REGISTERED", "BrokerIdNotRegisteredException", Fatal),
    row(103, "INCONSISTENT_TOPIC_ID", "InconsistentTopicIdException", Retriable),
    row(104, "INCONSISTENT_CLUSTER_ID", "InconsistentClusterIdException", Fatal),
    row(105, "TRANSACTIONAL_ID_NOT_FOUND", "TransactionalIdNotFoundException", Fatal),
    row(106, "FETCH_SESSION_TOPIC_ID_ERROR", "FetchSessionTopicIdException", Retriable),
    row(107, "INELIGIBLE_REPLICA", "IneligibleReplicaException", Fatal),
    row(108, "NEW_LEADER_ELECTED", "NewLeaderElectedException", Fatal),
    row(109, "OFFSET_MOVED_TO_TIERED_STORAGE", "OffsetMovedToTieredStorageException", Fatal),
    row(110, "FENCED_MEMBER_EPOCH", "FencedMemberEpochException", Fatal),
    row(111, "UNRELEASED_INSTANCE_ID", "UnreleasedInstanceIdException", Fatal),
    row(112, "UNSUPPORTED_ASSIGNOR", "UnsupportedAssignorException", Fatal),
    row(113, "STALE_MEMBER_EPOCH", "StaleMemberEpochException", Fatal),
    row(114, "MISMATCHED_ENDPOINT_TYPE", "MismatchedEndpointTypeException", Fatal),
    row(115, "UNSUPPORTED_ENDPOINT_TYPE", "UnsupportedEndpointTypeException", Fatal),
    row(116, "UNKNOWN_CONTROLLER_ID", "UnknownControllerIdException", Fatal),
    row(117, "UNKNOWN_SUBSCRIPTION_ID", "UnknownSubscriptionIdException", Fatal),
    row(118, "TELEMETRY_TOO_LARGE", "TelemetryTooLargeException", Fatal),
    row(119, "INVALID_REGISTRATION", "InvalidRegistrationException", Fatal),
    row(120, "TRANSACTION_ABORTABLE", "TransactionAbortableException", Fatal),
    row(121, "INVALID_RECORD_STATE", "InvalidRecordStateException", Fatal),
    row(122, "SHARE_SESSION_NOT_FOUND", "ShareSessionNotFoundException", Retriable),
    row(123, "INVALID_SHARE_SESSION_EPOCH", "InvalidShareSessionEpochException", Retriable),
    row(124, "FENCED_STATE_EPOCH", "FencedStateEpochException", Fatal),
    row(125, "INVALID_VOTER_KEY", "InvalidVoterKeyException", Fatal),
    row(126, "DUPLICATE_VOTER", "DuplicateVoterException", Fatal),
    row(127, "VOTER_NOT_FOUND", "VoterNotFoundException", Fatal),
    row(128, "INVALID_REGULAR_EXPRESSION", "InvalidRegularExpression", Fatal),
];

/// The row of a code, if the table has it.
pub fn by_code(code: i16) -> Option<&'static ErrorCode> {
    ERROR_CODES.iter().find(|row| row.code == code)
}

/// The numeric code of an rskafka error.
pub fn code_of(error: &ProtocolError) -> i16 {
    if let ProtocolError::Unknown(code) = error {
        return *code;
    }
    ERROR_CODES
        .iter()
        .find(|row| ProtocolError::new(row.code).as_ref() == Some(error))
        .map_or(-1, |row| row.code)
}

/// What the publisher does with an error the broker answered with. A code
/// the table does not know is, as in the Java client,
/// `UNKNOWN_SERVER_ERROR`: not retriable, not about a record.
pub fn class_of(error: &ProtocolError) -> ErrorClass {
    by_code(code_of(error)).map_or(Fatal, |row| row.class)
}

/// Errors of the Kafka layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaError {
    /// No TCP connection to a broker (refused, unreachable, a name that
    /// does not resolve).
    #[error("cannot connect to broker {broker}")]
    Connect {
        broker: String,
        #[source]
        source: std::io::Error,
    },
    /// An exchange on an open connection failed: the connection closed or
    /// broke, or an answer could not be read.
    // rskafka's errors print their own causes: the source is in the text,
    // not chained a second time.
    #[error("Kafka {operation} with broker {broker} failed: {source}")]
    Request {
        operation: &'static str,
        broker: String,
        source: RequestError,
    },
    /// The first request of a new connection (the API versions) failed.
    #[error("broker {broker} did not answer the first request{}: {source}", if *plaintext { " (closed at once: a TLS listener? check KAFKA_SECURITY_PROTOCOL)" } else { "" })]
    Versions {
        broker: String,
        /// Under `PLAINTEXT` or `SASL_PLAINTEXT`: the message names the
        /// setting, as a TLS listener closing is one reason.
        plaintext: bool,
        source: SyncVersionsError,
    },
    /// The broker answered with an error code.
    #[error("broker answered {operation} with {}{}", error_name(error), message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Broker {
        operation: &'static str,
        error: ProtocolError,
        message: Option<String>,
    },
    #[error("topic {0:?} does not exist (create it, or set KAFKA_CREATE_TOPIC=true)")]
    TopicMissing(String),
    #[error("topic {0:?} has no partitions")]
    NoPartitions(String),
    /// A partition the metadata lists without a leader.
    #[error("partition {partition} of topic {topic:?} has no leader")]
    NoLeader { topic: String, partition: i32 },
    /// The rows were routed for another partition count than the topic has
    /// now (it grew, or was deleted and created again): they are routed
    /// again before they are sent.
    #[error("topic {topic:?} has {now} partitions; the rows were routed for {routed}")]
    LayoutChanged {
        topic: String,
        routed: i32,
        now: i32,
    },
    /// An answer that does not belong to its request (another topic or
    /// partition).
    #[error("broker {broker} answered {operation} with {what}")]
    Unexpected {
        operation: &'static str,
        broker: String,
        what: String,
    },
    #[error("Kafka {operation} timed out after {timeout:?}")]
    Timeout {
        operation: String,
        timeout: Duration,
    },
    /// TLS or SASL refused the connection (the text names the setting).
    #[error(transparent)]
    Security(#[from] SecurityError),
}

impl KafkaError {
    /// The Kafka error name when the broker answered with an error code
    /// (`MESSAGE_TOO_LARGE`, `NOT_ENOUGH_REPLICAS`, …), otherwise a
    /// `CLIENT_…` name for what failed on this side.
    pub fn code(&self) -> String {
        match self {
            KafkaError::Broker { error, .. } => error_name(error),
            KafkaError::Connect { .. } => "CLIENT_CONNECT".into(),
            KafkaError::Request { source, .. } if unsupported_request(source) => {
                "UNSUPPORTED_VERSION".into()
            }
            KafkaError::Versions {
                source: SyncVersionsError::RequestError(source),
                ..
            } if !unsupported_request(source) => "CLIENT_REQUEST".into(),
            KafkaError::Versions { .. } => "UNSUPPORTED_VERSION".into(),
            KafkaError::Request { .. } | KafkaError::Unexpected { .. } => "CLIENT_REQUEST".into(),
            KafkaError::TopicMissing(_) => "UNKNOWN_TOPIC_OR_PARTITION".into(),
            KafkaError::NoPartitions(_) => "CLIENT_NO_PARTITIONS".into(),
            KafkaError::NoLeader { .. } => "LEADER_NOT_AVAILABLE".into(),
            KafkaError::LayoutChanged { .. } => crate::outbox::transport::LAYOUT_CHANGED.into(),
            KafkaError::Timeout { .. } => "CLIENT_TIMEOUT".into(),
            KafkaError::Security(_) => "CLIENT_SECURITY".into(),
        }
    }

    /// What the pipeline does with this error (see the module docs).
    pub fn class(&self) -> ErrorClass {
        match self {
            KafkaError::Broker { error, .. } => class_of(error),
            KafkaError::Request { source, .. } if unsupported_request(source) => Fatal,
            KafkaError::Versions {
                source: SyncVersionsError::RequestError(source),
                ..
            } if !unsupported_request(source) => Retriable,
            KafkaError::Versions { .. } => Fatal,
            KafkaError::Connect { .. }
            | KafkaError::Request { .. }
            | KafkaError::Unexpected { .. }
            | KafkaError::NoLeader { .. }
            | KafkaError::LayoutChanged { .. }
            | KafkaError::Timeout { .. } => Retriable,
            KafkaError::TopicMissing(_) | KafkaError::NoPartitions(_) | KafkaError::Security(_) => {
                Fatal
            }
        }
    }

    /// Whether the partition's leader is looked up again before the next
    /// try: yes after a retriable error, unless the broker answered as the
    /// leader and only lacks replicas or asks to slow down; never after a
    /// refusal or a non-retriable answer (the leader is fine, and a new
    /// connection per try is what an authorization failure must not cost).
    pub fn leader_suspect(&self) -> bool {
        if self.class() != Retriable {
            return false;
        }
        !matches!(
            self,
            KafkaError::Broker {
                error: ProtocolError::NotEnoughReplicas
                    | ProtocolError::NotEnoughReplicasAfterAppend
                    | ProtocolError::ThrottlingQuotaExceeded,
                ..
            } | KafkaError::LayoutChanged { .. }
        )
    }

    /// Whether the connection the error came from is given up: it broke,
    /// answered out of turn, or stayed silent past the request timeout (a
    /// frozen broker, a network that drops packets). The next request
    /// opens a new one; requests still waiting on the old one keep it
    /// until they end.
    pub fn connection_suspect(&self) -> bool {
        matches!(
            self,
            KafkaError::Request { .. } | KafkaError::Unexpected { .. } | KafkaError::Timeout { .. }
        )
    }

    /// This error as the seam carries it: its class, its Kafka name, and
    /// the message with its causes.
    pub fn to_send_error(&self) -> SendError {
        SendError::new(
            self.class(),
            self.code(),
            crate::telemetry::ErrorChain(self).to_string(),
        )
    }
}

/// A request the broker supports no version of (a broker older than the
/// protocol this worker speaks): nothing changes until it is upgraded.
fn unsupported_request(error: &RequestError) -> bool {
    matches!(error, RequestError::NoVersionMatch { .. })
}

/// The Kafka name of an error code: `MessageTooLarge` → `MESSAGE_TOO_LARGE`.
pub fn error_name(error: &ProtocolError) -> String {
    if let ProtocolError::Unknown(code) = error {
        return format!("UNKNOWN_CODE_{code}");
    }
    let camel = format!("{error:?}");
    let mut name = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if i > 0 && c.is_ascii_uppercase() {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The codes whose Java exception extends `RetriableException`
    /// (directly, or through `InvalidMetadataException`), as read from
    /// Kafka's sources: a second, independent list of the same facts.
    const JAVA_RETRIABLE: [&str; 31] = [
        "CORRUPT_MESSAGE",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "LEADER_NOT_AVAILABLE",
        "NOT_LEADER_OR_FOLLOWER",
        "REQUEST_TIMED_OUT",
        "REPLICA_NOT_AVAILABLE",
        "NETWORK_EXCEPTION",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "COORDINATOR_NOT_AVAILABLE",
        "NOT_COORDINATOR",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "NOT_CONTROLLER",
        "CONCURRENT_TRANSACTIONS",
        "KAFKA_STORAGE_ERROR",
        "FETCH_SESSION_ID_NOT_FOUND",
        "INVALID_FETCH_SESSION_EPOCH",
        "LISTENER_NOT_FOUND",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
        "OFFSET_NOT_AVAILABLE",
        "PREFERRED_LEADER_NOT_AVAILABLE",
        "ELIGIBLE_LEADERS_NOT_AVAILABLE",
        "ELECTION_NOT_NEEDED",
        "UNSTABLE_OFFSET_COMMIT",
        "THROTTLING_QUOTA_EXCEEDED",
        "UNKNOWN_TOPIC_ID",
        "INCONSISTENT_TOPIC_ID",
        "FETCH_SESSION_TOPIC_ID_ERROR",
        "SHARE_SESSION_NOT_FOUND",
        "INVALID_SHARE_SESSION_EPOCH",
    ];

    #[test]
    fn the_table_is_every_code_once_in_order() {
        let codes: Vec<i16> = ERROR_CODES.iter().map(|row| row.code).collect();
        let expected: Vec<i16> = (-1..=128).filter(|code| *code != 0).collect();
        assert_eq!(codes, expected);
    }

    /// The retriable codes are the Java client's, but `CORRUPT_MESSAGE`,
    /// refused instead (see the module docs).
    #[test]
    fn retriable_as_in_the_java_client_but_a_corrupt_record() {
        let retriable: Vec<&str> = ERROR_CODES
            .iter()
            .filter(|row| row.class == Retriable)
            .map(|row| row.name)
            .collect();
        let mut expected: Vec<&str> = JAVA_RETRIABLE
            .into_iter()
            .filter(|name| *name != "CORRUPT_MESSAGE")
            .collect();
        expected.sort_by_key(|name| ERROR_CODES.iter().position(|row| row.name == *name));
        assert_eq!(retriable, expected);
    }

    #[test]
    fn names_and_codes_agree_with_rskafka() {
        let mut named = 0;
        for row in ERROR_CODES {
            let error = ProtocolError::new(row.code).expect("not NONE");
            assert_eq!(code_of(&error), row.code, "{}", row.name);
            assert_eq!(class_of(&error), row.class, "{}", row.name);
            if !matches!(error, ProtocolError::Unknown(_)) {
                assert_eq!(error_name(&error), row.name);
                named += 1;
            }
        }
        assert!(named > 100, "rskafka names {named} codes");
    }

    /// Only records the broker will never accept are parked, a corrupt one
    /// among them (it was retried forever).
    #[test]
    fn four_codes_park_a_record() {
        let refused: Vec<&str> = ERROR_CODES
            .iter()
            .filter(|row| row.class == Refused)
            .map(|row| row.name)
            .collect();
        assert_eq!(
            refused,
            [
                "CORRUPT_MESSAGE",
                "MESSAGE_TOO_LARGE",
                "RECORD_LIST_TOO_LARGE",
                "INVALID_RECORD"
            ]
        );
        // The record's timestamp is the send time: a refused timestamp is
        // the clocks' fault, for every record alike.
        assert_eq!(class_of(&ProtocolError::InvalidTimestamp), Fatal);
        for fails in [
            ProtocolError::TopicAuthorizationFailed,
            ProtocolError::ClusterAuthorizationFailed,
            ProtocolError::SaslAuthenticationFailed,
            ProtocolError::UnsupportedVersion,
            ProtocolError::UnknownServerError,
            ProtocolError::PolicyViolation,
            ProtocolError::Unknown(999),
        ] {
            assert_eq!(class_of(&fails), Fatal, "{fails:?}");
        }
        // A code newer than rskafka's names, but in the table.
        assert_eq!(code_of(&ProtocolError::Unknown(122)), 122);
        assert_eq!(class_of(&ProtocolError::Unknown(122)), Retriable);
    }

    /// A produce the broker answered with `error`.
    pub(in crate::outbox::kafka) fn server(error: ProtocolError) -> KafkaError {
        KafkaError::Broker {
            operation: "produce",
            error,
            message: None,
        }
    }

    #[test]
    fn error_codes_carry_kafka_names() {
        assert_eq!(
            server(ProtocolError::MessageTooLarge).code(),
            "MESSAGE_TOO_LARGE"
        );
        assert_eq!(
            server(ProtocolError::NotEnoughReplicas).code(),
            "NOT_ENOUGH_REPLICAS"
        );
        assert_eq!(
            server(ProtocolError::Unknown(999)).code(),
            "UNKNOWN_CODE_999"
        );
        let timeout = KafkaError::Timeout {
            operation: "produce".into(),
            timeout: Duration::from_secs(1),
        };
        assert_eq!(timeout.code(), "CLIENT_TIMEOUT");
    }

    #[test]
    fn errors_are_classed_as_kafka_classes_them() {
        for refused in [
            ProtocolError::MessageTooLarge,
            ProtocolError::RecordListTooLarge,
            ProtocolError::InvalidRecord,
            ProtocolError::CorruptMessage,
        ] {
            assert_eq!(server(refused).class(), Refused, "{refused:?}");
            assert!(!server(refused).leader_suspect());
        }
        for retriable in [
            ProtocolError::NotLeaderOrFollower,
            ProtocolError::LeaderNotAvailable,
            ProtocolError::NotEnoughReplicas,
            ProtocolError::NotEnoughReplicasAfterAppend,
            ProtocolError::RequestTimedOut,
            ProtocolError::ThrottlingQuotaExceeded,
            ProtocolError::NetworkException,
            ProtocolError::UnknownTopicOrPartition,
        ] {
            assert_eq!(server(retriable).class(), Retriable, "{retriable:?}");
        }
        for fatal in [
            ProtocolError::TopicAuthorizationFailed,
            ProtocolError::ClusterAuthorizationFailed,
            ProtocolError::UnsupportedVersion,
            ProtocolError::InvalidTimestamp,
            ProtocolError::Unknown(999),
        ] {
            assert_eq!(server(fatal).class(), Fatal, "{fatal:?}");
            assert!(
                !server(fatal).leader_suspect(),
                "no new connection per try: {fatal:?}"
            );
        }
        let timeout = KafkaError::Timeout {
            operation: "produce".into(),
            timeout: Duration::from_secs(1),
        };
        assert_eq!(timeout.class(), Retriable);
        assert!(timeout.leader_suspect() && timeout.connection_suspect());
        assert_eq!(KafkaError::TopicMissing("t".into()).class(), Fatal);
        // TCP to a broker failed: a broker down, not a refusal.
        let down = KafkaError::Connect {
            broker: "b:9092".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert_eq!(
            (down.class(), down.code().as_str()),
            (Retriable, "CLIENT_CONNECT")
        );
        // A TLS or SASL refusal waits for an operator.
        let refused = KafkaError::Security(SecurityError::Sasl {
            mechanism: "PLAIN",
            servers: "b:9092".into(),
        });
        assert_eq!(
            (refused.class(), refused.code().as_str()),
            (Fatal, "CLIENT_SECURITY")
        );
        // A broker too old for the produce versions spoken here.
        let old = KafkaError::Request {
            operation: "produce",
            broker: "b:9092".into(),
            source: RequestError::NoVersionMatch {
                api_key: rskafka::protocol::api_key::ApiKey::Produce,
            },
        };
        assert_eq!(
            (old.class(), old.code().as_str()),
            (Fatal, "UNSUPPORTED_VERSION")
        );
        let stale = KafkaError::LayoutChanged {
            topic: "t".into(),
            routed: 3,
            now: 2,
        };
        assert_eq!(stale.class(), Retriable);
        assert!(!stale.leader_suspect() && !stale.connection_suspect());
    }

    #[test]
    fn the_leader_is_looked_up_again_unless_it_answered_as_leader() {
        for suspect in [
            ProtocolError::NotLeaderOrFollower,
            ProtocolError::LeaderNotAvailable,
            ProtocolError::UnknownTopicOrPartition,
            ProtocolError::RequestTimedOut,
        ] {
            assert!(server(suspect).leader_suspect(), "{suspect:?}");
            assert!(!server(suspect).connection_suspect(), "{suspect:?}");
        }
        for leader_fine in [
            ProtocolError::NotEnoughReplicas,
            ProtocolError::NotEnoughReplicasAfterAppend,
            ProtocolError::ThrottlingQuotaExceeded,
        ] {
            assert!(!server(leader_fine).leader_suspect(), "{leader_fine:?}");
        }
    }
}
