//! The Kafka transport against a scripted broker: a TCP listener that
//! speaks Kafka's protocol (rskafka's types read the requests and write
//! the headers; the Produce and Metadata answers, which rskafka only
//! reads, are written here field by field) and answers as each test says.
//! Real sockets and the real transport; only the broker is scripted, so a
//! throttled answer, a half-written request, a broken connection or a
//! topic laid out anew happen exactly when the test wants them.

use std::{
    collections::VecDeque,
    io::{Cursor, Read},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use chrono::{DateTime, TimeZone, Utc};
use rskafka::protocol::{
    api_key::ApiKey,
    api_version::ApiVersion,
    frame::{AsyncMessageRead, AsyncMessageWrite},
    messages::{
        ApiVersionsResponse, ApiVersionsResponseApiKey, ReadVersionedType, RequestHeader,
        ResponseHeader, WriteVersionedType,
    },
    primitives::{Boolean, Int16, Int32, Int64, NullableString, Records, String_, TaggedFields},
    record::ControlBatchOrRecords,
    traits::{ReadType, WriteType},
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::Notify,
};

use super::*;
use crate::{clock::ManualClock, outbox::transport::ErrorClass};

/// How the broker answers the next produce request.
#[derive(Debug, Clone)]
enum Produce {
    /// Appended; `throttle_ms` asks for a hold (KIP-219).
    Ack { throttle_ms: i32 },
    /// The partition's error code.
    Error(i16),
    /// The connection is closed without an answer.
    Close,
    /// Appended, and nothing more is read from the connection until
    /// `resume` is notified (the client's writes pile up).
    AckThenStall,
    /// Appended and answered, then the connection is closed (a broker
    /// closing an idle connection).
    AckThenClose,
    /// Appended, answered only once `resume` is notified (a leader waiting
    /// for a frozen follower): the connection reads nothing meanwhile, as
    /// a broker's does.
    Hold,
}

/// One produce request as the broker read it.
#[derive(Debug, Clone)]
struct Received {
    connection: usize,
    partition: i32,
    keys: Vec<String>,
    first_timestamp: i64,
}

#[derive(Default)]
struct Script {
    /// Partition count of the topic (`None`: the topic does not exist).
    partitions: Option<i32>,
    produce: VecDeque<Produce>,
    received: Vec<Received>,
    metadata_reads: usize,
    connections: usize,
}

struct ScriptedBroker {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    resume: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedBroker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const TOPIC: &str = "scripted";
const NODE: i32 = 1;

impl ScriptedBroker {
    async fn start(partitions: i32) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let script = Arc::new(Mutex::new(Script {
            partitions: Some(partitions),
            ..Script::default()
        }));
        let resume = Arc::new(Notify::new());
        let task = tokio::spawn({
            let script = Arc::clone(&script);
            let resume = Arc::clone(&resume);
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let connection = {
                        let mut s = script.lock().expect("script");
                        s.connections += 1;
                        s.connections
                    };
                    tokio::spawn(serve(
                        stream,
                        connection,
                        addr,
                        Arc::clone(&script),
                        Arc::clone(&resume),
                    ));
                }
            }
        });
        Self {
            addr,
            script,
            resume,
            task,
        }
    }

    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().expect("script")
    }

    fn answer_next(&self, answers: impl IntoIterator<Item = Produce>) {
        self.script().produce.extend(answers);
    }

    fn transport(&self, clock: Arc<dyn Clock>) -> KafkaTransport {
        let mut settings = KafkaSettings::new(vec![self.addr.to_string()]);
        settings.request_timeout = Duration::from_secs(5);
        KafkaTransport::new(settings).with_clock(clock)
    }
}

/// Serves one connection: reads requests in order and answers each.
async fn serve(
    mut stream: TcpStream,
    connection: usize,
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    resume: Arc<Notify>,
) {
    let _ = stream.set_nodelay(true);
    loop {
        let Ok(message) = stream.read_message(64 * 1024 * 1024).await else {
            return;
        };
        let mut body = Cursor::new(message);
        let key = ApiKey::from(Int16::read(&mut body).expect("api key"));
        let version = ApiVersion(Int16::read(&mut body).expect("api version"));
        body.set_position(0);
        // ApiVersions v3+ is a flexible request: header version 2.
        let header_version = if key == ApiKey::ApiVersions && version.0.0 >= 3 {
            2
        } else {
            1
        };
        let header = RequestHeader::read_versioned(&mut body, ApiVersion(Int16(header_version)))
            .expect("request header");
        let mut answer = Vec::new();
        ResponseHeader {
            correlation_id: header.correlation_id,
            tagged_fields: None,
        }
        .write_versioned(&mut answer, ApiVersion(Int16(0)))
        .expect("in memory");
        let mut stall = false;
        let mut close = false;
        match key {
            ApiKey::ApiVersions => api_versions(&mut answer, version),
            ApiKey::Metadata => {
                let partitions = {
                    let mut s = script.lock().expect("script");
                    s.metadata_reads += 1;
                    s.partitions
                };
                metadata(&mut answer, version, addr, partitions);
            }
            ApiKey::Produce => {
                let (partition, keys, first_timestamp) = read_produce(&mut body);
                let next = {
                    let mut s = script.lock().expect("script");
                    s.received.push(Received {
                        connection,
                        partition,
                        keys,
                        first_timestamp,
                    });
                    s.produce
                        .pop_front()
                        .unwrap_or(Produce::Ack { throttle_ms: 0 })
                };
                match next {
                    Produce::Close => return,
                    Produce::Ack { throttle_ms } => {
                        produce_answer(&mut answer, version, partition, 0, throttle_ms)
                    }
                    Produce::Error(code) => {
                        produce_answer(&mut answer, version, partition, code, 0)
                    }
                    Produce::AckThenStall => {
                        stall = true;
                        produce_answer(&mut answer, version, partition, 0, 0)
                    }
                    Produce::AckThenClose => {
                        close = true;
                        produce_answer(&mut answer, version, partition, 0, 0)
                    }
                    Produce::Hold => {
                        resume.notified().await;
                        produce_answer(&mut answer, version, partition, 0, 0)
                    }
                }
            }
            other => panic!("the scripted broker does not answer {other:?}"),
        }
        if stream.write_message(&answer).await.is_err() {
            return;
        }
        if close {
            return;
        }
        if stall {
            resume.notified().await;
        }
    }
}

fn api_versions(answer: &mut Vec<u8>, version: ApiVersion) {
    let range = |api_key, min, max| ApiVersionsResponseApiKey {
        api_key,
        min_version: ApiVersion(Int16(min)),
        max_version: ApiVersion(Int16(max)),
        tagged_fields: (version.0.0 >= 3).then(TaggedFields::default),
    };
    ApiVersionsResponse {
        error_code: None,
        api_keys: vec![
            range(ApiKey::ApiVersions, 0, 3),
            range(ApiKey::Metadata, 0, 4),
            range(ApiKey::Produce, 3, 7),
        ],
        throttle_time_ms: (version.0.0 >= 1).then_some(Int32(0)),
        tagged_fields: (version.0.0 >= 3).then(TaggedFields::default),
    }
    .write_versioned(answer, version)
    .expect("in memory");
}

fn write<T: WriteType<Vec<u8>>>(answer: &mut Vec<u8>, value: T) {
    value.write(answer).expect("in memory");
}

/// A Metadata answer (versions 1 to 4): this broker as node 1, leader of
/// every partition of the topic.
fn metadata(answer: &mut Vec<u8>, version: ApiVersion, addr: SocketAddr, partitions: Option<i32>) {
    let v = version.0.0;
    assert!((1..=4).contains(&v), "metadata v{v}");
    if v >= 3 {
        write(answer, Int32(0));
    }
    write(answer, Int32(1));
    write(answer, Int32(NODE));
    write(answer, String_(addr.ip().to_string()));
    write(answer, Int32(i32::from(addr.port())));
    write(answer, NullableString(None));
    if v >= 2 {
        write(answer, NullableString(Some("scripted".into())));
    }
    write(answer, Int32(NODE));
    write(answer, Int32(1));
    let count = partitions.unwrap_or(0);
    write(answer, Int16(if partitions.is_some() { 0 } else { 3 }));
    write(answer, String_(TOPIC.into()));
    write(answer, Boolean(false));
    write(answer, Int32(count));
    for partition in 0..count {
        write(answer, Int16(0));
        write(answer, Int32(partition));
        write(answer, Int32(NODE));
        for _replicas_then_isr in 0..2 {
            write(answer, Int32(1));
            write(answer, Int32(NODE));
        }
    }
}

/// The partition, keys and first timestamp of a produce request (one
/// topic, one partition, one batch: what the transport sends).
fn read_produce(body: &mut Cursor<Vec<u8>>) -> (i32, Vec<String>, i64) {
    NullableString::read(body).expect("transactional id");
    let acks = Int16::read(body).expect("acks");
    assert_eq!(acks.0, -1, "acks = all");
    Int32::read(body).expect("timeout");
    assert_eq!(Int32::read(body).expect("topics").0, 1);
    assert_eq!(String_::read(body).expect("topic").0, TOPIC);
    assert_eq!(Int32::read(body).expect("partitions").0, 1);
    let partition = Int32::read(body).expect("partition").0;
    let Records(batches) = Records::read(body).expect("records");
    let mut rest = Vec::new();
    body.read_to_end(&mut rest).expect("in memory");
    assert!(rest.is_empty(), "the request was read whole");
    let batch = batches.first().expect("one batch");
    let ControlBatchOrRecords::Records(records) = &batch.records else {
        panic!("a control batch");
    };
    let keys = records
        .iter()
        .map(|r| String::from_utf8(r.key.clone().unwrap_or_default()).expect("utf-8 key"))
        .collect();
    (partition, keys, batch.first_timestamp)
}

/// A Produce answer (versions 3 to 7) for one partition.
fn produce_answer(
    answer: &mut Vec<u8>,
    version: ApiVersion,
    partition: i32,
    code: i16,
    throttle_ms: i32,
) {
    let v = version.0.0;
    write(answer, Int32(1));
    write(answer, String_(TOPIC.into()));
    write(answer, Int32(1));
    write(answer, Int32(partition));
    write(answer, Int16(code));
    write(answer, Int64(if code == 0 { 42 } else { -1 }));
    write(answer, Int64(-1));
    if v >= 5 {
        write(answer, Int64(0));
    }
    write(answer, Int32(throttle_ms));
}

fn records(keys: impl IntoIterator<Item = String>) -> Vec<OutgoingRecord> {
    keys.into_iter()
        .map(|key| OutgoingRecord {
            key,
            value: b"v".to_vec(),
            headers: Default::default(),
        })
        .collect()
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(ManualClock::new(at(0)))
}

fn at(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(1_800_000_000_000 + ms)
        .single()
        .expect("valid")
}

/// The defect of rskafka's `PartitionClient`: a throttled answer made it
/// send the acknowledged records again. Here it is a success: each
/// record reaches the broker once, and the next request waits out the
/// hold the broker asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_success_is_never_sent_again_and_holds_the_next_request() {
    let broker = ScriptedBroker::start(3).await;
    let throttle = ThrottleMetrics::default();
    let transport = broker
        .transport(clock())
        .with_throttle_metrics(throttle.clone());
    let hold = Duration::from_millis(400);
    broker.answer_next([
        Produce::Ack {
            throttle_ms: hold.as_millis() as i32,
        },
        Produce::Ack { throttle_ms: 0 },
    ]);
    transport
        .produce(TOPIC, 0, 3, records(["a".to_owned(), "b".to_owned()]))
        .await
        .expect("a throttled answer is a success");
    let second = tokio::time::Instant::now();
    transport
        .produce(TOPIC, 1, 3, records(["c".to_owned()]))
        .await
        .expect("acknowledged");
    let waited = second.elapsed();
    assert!(
        waited >= hold,
        "the next request waited {waited:?}, not {hold:?}"
    );
    let received = broker.script().received.clone();
    let keys: Vec<Vec<String>> = received.iter().map(|r| r.keys.clone()).collect();
    assert_eq!(keys, [vec!["a", "b"], vec!["c"]], "each record sent once");
    assert_eq!(throttle.responses.get(), 1);
    assert!((throttle.seconds.get() - hold.as_secs_f64()).abs() < 1e-9);
}

/// Requests that do not overlap share one connection per broker; requests
/// on the way at once each have their own, so none waits behind another
/// partition's (a broker answers a connection's requests one at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_carries_one_request_at_a_time() {
    let broker = ScriptedBroker::start(3).await;
    let transport = broker.transport(clock());
    for round in 0..3 {
        for partition in 0..3 {
            transport
                .produce(
                    TOPIC,
                    partition,
                    3,
                    records([format!("{round}-{partition}")]),
                )
                .await
                .expect("acknowledged");
        }
    }
    {
        let script = broker.script();
        let used: std::collections::BTreeSet<usize> =
            script.received.iter().map(|r| r.connection).collect();
        assert_eq!(used.len(), 1, "one after another, one connection: {used:?}");
        assert_eq!(script.connections, 2, "one for metadata, one for produce");
        assert_eq!(script.metadata_reads, 1, "the layout read once");
    }
    let at_once = (0..3).map(|partition| {
        transport.produce(
            TOPIC,
            partition,
            3,
            records([format!("at-once-{partition}")]),
        )
    });
    for result in futures_util::future::join_all(at_once).await {
        result.expect("acknowledged");
    }
    let open = transport.produce_connections();
    assert_eq!(open.len(), 1, "{open:?}");
    assert!(
        (1..=3).contains(&open[0].1),
        "at most one per request at once: {open:?}"
    );
}

/// A partition whose request waits (a leader waiting for a frozen
/// follower) holds up no other partition of the same broker: their
/// requests go on other connections and are answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_request_holds_up_no_other_partition_of_its_broker() {
    let broker = ScriptedBroker::start(3).await;
    let transport = Arc::new(broker.transport(clock()));
    transport
        .produce(TOPIC, 1, 3, records(["warm".to_owned()]))
        .await
        .expect("connected");
    broker.answer_next([Produce::Hold]);
    let waiting = tokio::spawn({
        let transport = Arc::clone(&transport);
        async move {
            transport
                .produce(TOPIC, 0, 3, records(["slow".to_owned()]))
                .await
        }
    });
    // The held request is on the way before the others start.
    tokio::time::timeout(Duration::from_secs(5), async {
        while broker.script().received.len() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the held request arrived");
    for i in 0..5 {
        tokio::time::timeout(
            Duration::from_secs(2),
            transport.produce(TOPIC, 2, 3, records([format!("fast-{i}")])),
        )
        .await
        .expect("not held up behind partition 0")
        .expect("acknowledged");
    }
    assert!(!waiting.is_finished(), "partition 0 still waits");
    broker.resume.notify_one();
    waiting
        .await
        .expect("joined")
        .expect("acknowledged at last");
    let received = broker.script().received.clone();
    assert_eq!(received.len(), 7, "each record once: {received:?}");
}

/// A request whose future is dropped half-written (the broker not
/// reading, the socket full) is finished on the wire by rskafka, and its
/// connection is closed rather than reused: the next request goes on a
/// connection of its own, and every request arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cut_short_closes_its_connection_and_the_next_goes_on() {
    let broker = ScriptedBroker::start(1).await;
    let transport = broker.transport(clock());
    broker.answer_next([Produce::AckThenStall]);
    transport
        .produce(TOPIC, 0, 1, records(["warm".to_owned()]))
        .await
        .expect("connected");
    // Far more than the socket buffers take: the write stops half-way.
    let big: Vec<OutgoingRecord> = (0..64)
        .map(|i| OutgoingRecord {
            key: format!("big-{i}"),
            value: vec![7; 256 * 1024],
            headers: Default::default(),
        })
        .collect();
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        transport.produce(TOPIC, 0, 1, big),
    )
    .await;
    assert!(dropped.is_err(), "the request was cut short half-written");
    assert_eq!(
        transport.produce_connections(),
        [],
        "its connection is closed"
    );
    broker.resume.notify_one();
    transport
        .produce(TOPIC, 0, 1, records(["after".to_owned()]))
        .await
        .expect("a new connection");
    tokio::time::timeout(Duration::from_secs(5), async {
        while broker.script().received.len() < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the cut request finished on the wire");
    let script = broker.script();
    let mut sizes: Vec<usize> = script.received.iter().map(|r| r.keys.len()).collect();
    sizes.sort();
    assert_eq!(sizes, [1, 1, 64], "every request arrived whole");
    assert_eq!(script.connections, 3, "metadata, the cut one, the new one");
}

/// A connection the broker closes fails the request on it (retriable: it
/// may have been written) and the next request opens a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_connection_is_opened_again() {
    let broker = ScriptedBroker::start(1).await;
    let transport = broker.transport(clock());
    broker.answer_next([Produce::Close]);
    let error = transport
        .produce(TOPIC, 0, 1, records(["lost".to_owned()]))
        .await
        .expect_err("no answer");
    assert_eq!(
        (error.class, error.code.as_str()),
        (ErrorClass::Retriable, "CLIENT_REQUEST"),
        "{error}"
    );
    transport
        .produce(TOPIC, 0, 1, records(["again".to_owned()]))
        .await
        .expect("a new connection");
    let script = broker.script();
    assert_eq!(
        script.connections, 3,
        "metadata, the closed one, the new one"
    );
    // The leader came into doubt with the connection: read again once.
    assert_eq!(script.metadata_reads, 2);
}

/// The topic laid out anew between a claim and its send (deleted and
/// created again with fewer partitions): a request routed for the old
/// count is not sent, and says so, so its rows are routed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_routed_for_another_layout_is_not_sent() {
    let broker = ScriptedBroker::start(3).await;
    let transport = broker.transport(clock());
    transport
        .produce(TOPIC, 2, 3, records(["before".to_owned()]))
        .await
        .expect("acknowledged");
    // Re-created with 2 partitions: partition 2 is gone.
    broker.script().partitions = Some(2);
    broker.answer_next([Produce::Error(3)]);
    let gone = transport
        .produce(TOPIC, 2, 3, records(["queued".to_owned()]))
        .await
        .expect_err("UNKNOWN_TOPIC_OR_PARTITION");
    assert_eq!(gone.code, "UNKNOWN_TOPIC_OR_PARTITION");
    let stale = transport
        .produce(TOPIC, 2, 3, records(["queued".to_owned()]))
        .await
        .expect_err("routed for 3, the topic has 2");
    assert_eq!(
        (stale.class, stale.code.as_str()),
        (
            ErrorClass::Retriable,
            crate::outbox::transport::LAYOUT_CHANGED
        ),
        "{stale}"
    );
    transport
        .produce(TOPIC, 1, 2, records(["rerouted".to_owned()]))
        .await
        .expect("routed for the new layout");
    let sent: Vec<(i32, Vec<String>)> = broker
        .script()
        .received
        .iter()
        .map(|r| (r.partition, r.keys.clone()))
        .collect();
    assert_eq!(
        sent,
        [
            (2, vec!["before".to_owned()]),
            (2, vec!["queued".to_owned()]),
            (1, vec!["rerouted".to_owned()])
        ],
        "nothing was sent for the stale layout"
    );
}

/// The record's create time is when its request is built, not when its
/// row was claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_stamped_when_the_request_is_built() {
    let broker = ScriptedBroker::start(1).await;
    let manual = ManualClock::new(at(0));
    let transport = broker.transport(Arc::new(manual.clone()));
    let claimed = records(["k".to_owned()]);
    manual.advance(chrono::Duration::seconds(7));
    transport
        .produce(TOPIC, 0, 1, claimed)
        .await
        .expect("acknowledged");
    let stamped = broker.script().received[0].first_timestamp;
    assert_eq!(stamped, at(7_000).timestamp_millis());
}

/// A topic the broker does not know is said so, by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_is_named() {
    let broker = ScriptedBroker::start(1).await;
    broker.script().partitions = None;
    let transport = broker.transport(clock());
    let error = transport.partitions(TOPIC).await.expect_err("missing");
    assert_eq!(
        (error.class, error.code.as_str()),
        (ErrorClass::Fatal, "UNKNOWN_TOPIC_OR_PARTITION")
    );
    assert!(error.message.contains("KAFKA_CREATE_TOPIC"), "{error}");
}

/// A connection the broker closed while it was idle (Kafka closes idle
/// connections after `connections.max.idle.ms`) is seen closed and not
/// used again: the next request goes on a new one and succeeds at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_broker_closed_while_idle_is_not_used_again() {
    let broker = ScriptedBroker::start(1).await;
    let transport = broker.transport(clock());
    broker.answer_next([Produce::AckThenClose]);
    transport
        .produce(TOPIC, 0, 1, records(["before".to_owned()]))
        .await
        .expect("acknowledged");
    tokio::time::timeout(Duration::from_secs(5), async {
        while !transport.produce_connections().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the close is seen");
    transport
        .produce(TOPIC, 0, 1, records(["after".to_owned()]))
        .await
        .expect("a new connection, no failed try");
    assert_eq!(
        broker.script().connections,
        3,
        "metadata, the closed one, a new one"
    );
}
