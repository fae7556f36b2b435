//! Kafka over TLS, against a real Apache Kafka 4.4.0 broker this module
//! starts once for all its tests (`scripts/kafka-tls.sh`: SSL, SSL with
//! client certificates required, SASL_SSL with a SCRAM-SHA-512 user made
//! when the storage is formatted, and SSL listeners with a wrong-name and
//! an expired certificate; certificates made with openssl). The round
//! trips go expiry → outbox → Kafka over TLS and are read back on the
//! broker's plaintext listener. Every bad case is one line naming the
//! setting, within `KAFKA_REQUEST_TIMEOUT`, with no secret in it.

use std::{
    path::PathBuf,
    sync::OnceLock,
    time::{Duration, Instant},
};

use booking_expiration::{
    config::{KafkaClientCert, KafkaSettings, KafkaTls, SaslMechanism, SaslSettings},
    outbox::{KafkaTransport, OutgoingRecord, Transport},
};
use testkit::free_port;
use tokio_util::sync::CancellationToken;

use crate::support::*;

const USER: &str = "alice";
const PASSWORD: &str = "alice-secret-7Hq";
/// Short, so the bad cases fail fast; each must fail within it. (2 s was
/// too short for the mTLS refusals while the whole suite loaded the two
/// cores: the broker's alert came after the deadline.)
const TIMEOUT: Duration = Duration::from_secs(5);

/// The broker of this module, started at the first use and stopped when
/// the test binary exits (the script's owner-process watcher).
struct TlsKafka {
    dir: PathBuf,
    port: u16,
}

impl TlsKafka {
    fn get() -> &'static TlsKafka {
        static BROKER: OnceLock<TlsKafka> = OnceLock::new();
        BROKER.get_or_init(|| {
            let dir = tempdir("kafka-tls");
            let port = testkit::free_port_block(7);
            let status = testkit::script("kafka-tls.sh")
                .args([
                    "start",
                    dir.to_str().expect("UTF-8 path"),
                    &port.to_string(),
                ])
                .env("KAFKA_TLS_OWNER_PID", std::process::id().to_string())
                .env("KAFKA_TLS_USER", USER)
                .env("KAFKA_TLS_PASSWORD", PASSWORD)
                .env("KAFKA_HEAP_OPTS", "-Xms128m -Xmx384m")
                .status()
                .expect("run scripts/kafka-tls.sh");
            assert!(status.success(), "the TLS broker did not start");
            TlsKafka { dir, port }
        })
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join("tls").join(name)
    }

    fn plaintext(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A listener by its offset (see scripts/kafka-tls.sh), by host name.
    fn listener(&self, offset: u16) -> String {
        format!("localhost:{}", self.port + offset)
    }
}

const SSL: u16 = 2;
const MTLS: u16 = 3;
const SASL_SSL: u16 = 4;
const WRONG_NAME: u16 = 5;
const EXPIRED: u16 = 6;

fn tls(ca: Option<&str>, client: Option<(&str, &str)>) -> Option<KafkaTls> {
    let kafka = TlsKafka::get();
    Some(KafkaTls {
        ca: ca.map(|name| kafka.file(name)),
        client: client.map(|(cert, key)| KafkaClientCert {
            cert: kafka.file(cert),
            key: kafka.file(key),
        }),
    })
}

fn settings(listener: String, tls: Option<KafkaTls>, password: Option<&str>) -> KafkaSettings {
    let mut settings = kafka_settings(vec![listener]);
    settings.request_timeout = TIMEOUT;
    settings.tls = tls;
    settings.sasl = password.map(|password| SaslSettings {
        mechanism: SaslMechanism::ScramSha512,
        username: USER.to_owned(),
        password: password.to_owned(),
    });
    settings
}

async fn topic() -> String {
    let name = format!("tls-{}", uuid::Uuid::new_v4().simple());
    testkit::kafka::create_topic(vec![TlsKafka::get().plaintext()], &name, 3)
        .await
        .expect("create a topic on the plaintext listener");
    name
}

/// Expires `n` bookings into the outbox of `topic`, publishes them with a
/// real `KafkaSink` of `kafka`, and reads them back on the plaintext
/// listener.
async fn round_trip(kafka: KafkaSettings, n: u64) {
    let topic = topic().await;
    let db = TestDb::new().await;
    db.seed_due(n, t0()).await;
    let clock = clock();
    db.worker_for(&clock, expiry_settings(200), events_on(&topic))
        .run_cycle(&CancellationToken::new())
        .await
        .expect("expiry cycle");
    let settings = publisher_settings(100);
    let timing = timing_for(&settings, kafka.request_timeout);
    let publisher = Rig::new(
        db.pool.clone(),
        KafkaTransport::new(kafka),
        &settings,
        timing,
        &topic,
    );
    let published = publisher.publish_until_idle(Duration::from_secs(60)).await;
    assert_eq!(published.published, n);
    let records = read_topic_from(vec![TlsKafka::get().plaintext()], &topic, 3).await;
    assert_eq!(records.len() as u64, n, "every event arrived once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_over_ssl_and_mutual_tls() {
    round_trip(
        settings(
            TlsKafka::get().listener(SSL),
            tls(Some("ca.crt"), None),
            None,
        ),
        50,
    )
    .await;
    round_trip(
        settings(
            TlsKafka::get().listener(MTLS),
            tls(Some("ca.crt"), Some(("client.crt", "client.key"))),
            None,
        ),
        50,
    )
    .await;
}

/// A failure of the metadata read: one line that says `expected`, within
/// the request timeout, with no password and no key.
async fn fails_clearly(
    name: &str,
    kafka: KafkaSettings,
    expected: &[&str],
) -> Result<String, String> {
    let timeout = kafka.request_timeout;
    let transport = KafkaTransport::new(kafka);
    let started = Instant::now();
    let error = transport
        .partitions("any-topic")
        .await
        .expect_err("must fail");
    let elapsed = started.elapsed();
    let line = error.message;
    let report = format!("{name} ({elapsed:?}): {line}");
    let missing: Vec<&&str> = expected
        .iter()
        .filter(|part| !line.contains(**part))
        .collect();
    if line.contains('\n')
        || !missing.is_empty()
        || elapsed >= timeout + Duration::from_secs(1)
        || line.contains(PASSWORD)
        || line.contains("PRIVATE KEY")
    {
        return Err(format!(
            "{report} (expected {missing:?}, one line, within {timeout:?}, no secret)"
        ));
    }
    Ok(report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cases_are_one_clear_line_within_the_timeout() {
    let kafka = TlsKafka::get();
    let ca = || tls(Some("ca.crt"), None);
    let cases = [
        (
            "wrong CA",
            settings(kafka.listener(SSL), tls(Some("other-ca.crt"), None), None),
            vec![
                "certificate verify failed",
                "KAFKA_SSL_CA_LOCATION",
                "other-ca.crt",
            ],
        ),
        (
            "bundled roots for a private CA",
            settings(kafka.listener(SSL), tls(None, None), None),
            vec!["not signed by a trusted CA", "KAFKA_SSL_CA_LOCATION"],
        ),
        (
            "wrong host name",
            settings(kafka.listener(WRONG_NAME), ca(), None),
            vec!["not valid for the host name", "KAFKA_BOOTSTRAP_SERVERS"],
        ),
        (
            "expired certificate",
            settings(kafka.listener(EXPIRED), ca(), None),
            vec!["has expired"],
        ),
        (
            "missing client certificate",
            settings(kafka.listener(MTLS), ca(), None),
            vec![
                "requires a client certificate",
                "KAFKA_SSL_CERTIFICATE_LOCATION",
            ],
        ),
        (
            "client certificate of another CA",
            settings(
                kafka.listener(MTLS),
                tls(Some("ca.crt"), Some(("stranger.crt", "stranger.key"))),
                None,
            ),
            vec![
                "refused the client certificate",
                "KAFKA_SSL_CERTIFICATE_LOCATION",
            ],
        ),
        (
            "wrong password",
            KafkaSettings {
                // A debug build spends about half a second of CPU on each
                // SCRAM-SHA-512 login (PBKDF2, 4096 rounds, unoptimised);
                // on two loaded cores the first refusal took over 5 s.
                request_timeout: Duration::from_secs(15),
                ..settings(kafka.listener(SASL_SSL), ca(), Some("not-the-password"))
            },
            vec!["SCRAM-SHA-512 authentication failed", "KAFKA_SASL_PASSWORD"],
        ),
        (
            "plaintext client on a TLS port",
            settings(kafka.listener(SSL), None, None),
            vec!["KAFKA_SECURITY_PROTOCOL"],
        ),
        (
            "TLS client on a plaintext port",
            settings(kafka.plaintext(), ca(), None),
            vec!["no TLS answer", "KAFKA_SECURITY_PROTOCOL"],
        ),
    ];
    // The SCRAM login computes PBKDF2 (4096 rounds) inside the client's
    // future: polled in the same task as the others it would hold them all
    // back on a debug build, so it runs on its own after them.
    let (slow, quick): (Vec<_>, Vec<_>) = cases
        .into_iter()
        .partition(|(name, _, _)| *name == "wrong password");
    let mut lines =
        futures_util::future::join_all(quick.into_iter().map(
            |(name, kafka, expected)| async move { fails_clearly(name, kafka, &expected).await },
        ))
        .await;
    for (name, kafka, expected) in slow {
        lines.push(fails_clearly(name, kafka, &expected).await);
    }
    let mut failed = Vec::new();
    for line in lines {
        match line {
            Ok(line) => eprintln!("as expected: {line}"),
            Err(line) => failed.push(line),
        }
    }
    assert!(failed.is_empty(), "not as expected:\n{}", failed.join("\n"));
}

/// Rotation: the CA and client certificate files are read again for every
/// new connection. The same sink fails with the wrong files, then works
/// once the files on disk are replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_files_are_used_without_a_restart() {
    let kafka = TlsKafka::get();
    let dir = tempdir("kafka-tls-rotation");
    let (ca, cert, key) = (dir.join("ca.pem"), dir.join("tls.crt"), dir.join("tls.key"));
    let put = |target: &PathBuf, source: &str| {
        std::fs::copy(kafka.file(source), target).expect("write a rotated file");
    };
    put(&ca, "other-ca.crt");
    put(&cert, "stranger.crt");
    put(&key, "stranger.key");
    let mut settings = settings(kafka.listener(MTLS), None, None);
    settings.tls = Some(KafkaTls {
        ca: Some(ca.clone()),
        client: Some(KafkaClientCert {
            cert: cert.clone(),
            key: key.clone(),
        }),
    });
    let transport = KafkaTransport::new(settings);
    let topic = topic().await;
    let error = transport.partitions(&topic).await.expect_err("wrong CA");
    assert!(error.message.contains("KAFKA_SSL_CA_LOCATION"), "{error}");
    put(&ca, "ca.crt");
    let error = transport
        .partitions(&topic)
        .await
        .expect_err("wrong client certificate");
    assert!(
        error.message.contains("refused the client certificate"),
        "{error}"
    );
    put(&cert, "client.crt");
    put(&key, "client.key");
    assert_eq!(
        transport.partitions(&topic).await.expect("rotated files"),
        3
    );
    // A produce, on the leader's connection, opened with the rotated files.
    let record = OutgoingRecord {
        key: "k".into(),
        value: b"v".to_vec(),
        headers: Default::default(),
    };
    transport
        .produce(&topic, 0, 3, vec![record])
        .await
        .expect("a produce with the rotated files");
}

/// The operator's path: `run` with SASL_SSL + SCRAM-SHA-512 as
/// docs/configuration.md shows it publishes, and `/readyz` is 503 while TLS fails (a wrong CA,
/// fixed on disk while it runs) and 200 after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_over_sasl_ssl_with_scram() {
    let kafka = TlsKafka::get();
    let topic = topic().await;
    let db = TestDb::new().await;
    const DUE: i64 = 200;
    db.seed_due(DUE as u64, wall_now()).await;
    let dir = tempdir("kafka-tls-run");
    let ca = dir.join("ca.pem");
    std::fs::copy(kafka.file("other-ca.crt"), &ca).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut command = binary();
    command
        .arg("run")
        .env("DATABASE_URL", &db.url)
        .env("KAFKA_BOOTSTRAP_SERVERS", kafka.listener(SASL_SSL))
        .env("KAFKA_TOPIC", &topic)
        .env("KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
        .env("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
        .env("KAFKA_SASL_USERNAME", USER)
        .env("KAFKA_SASL_PASSWORD", PASSWORD)
        .env("KAFKA_SSL_CA_LOCATION", &ca)
        // A debug build on a loaded machine can spend seconds on the
        // handshakes and SCRAM-SHA-512 logins of a fresh connection set.
        .env("KAFKA_REQUEST_TIMEOUT", "10s")
        .env("EXPIRATION_INTERVAL", "300ms")
        .env("METRICS_ADDR", &addr)
        .env("RUST_LOG", "warn");
    let mut running = Running::spawn(command);
    wait_http_status(&addr, "/readyz", 503, Duration::from_secs(60)).await;
    running
        .wait_for_log("KAFKA_SSL_CA_LOCATION", Duration::from_secs(10))
        .await;
    std::fs::copy(kafka.file("ca.crt"), &ca).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(&addr, "/readyz").await.map(|r| r.0) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "/readyz not 200 60 s after the CA was fixed; log:\n{}",
            running.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    db.wait_all_published(Duration::from_secs(60)).await;
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));
    let log = running.stderr();
    assert!(!log.contains(PASSWORD), "the password in the log");
    assert!(!log.contains("PRIVATE KEY"));
    let failure = log
        .lines()
        .find(|line| line.contains("KAFKA_SSL_CA_LOCATION"))
        .unwrap_or_default();
    eprintln!("logged while the CA was wrong: {failure}");
    let records = read_topic_from(vec![kafka.plaintext()], &topic, 3).await;
    assert_eq!(records.len() as i64, DUE);
}

/// Unreadable or malformed PEM files, and settings that contradict each
/// other: exit 2 at start, one line naming the setting, no key material.
#[test]
fn bad_files_and_contradictions_exit_2_at_start() {
    let kafka = TlsKafka::get();
    let dir = tempdir("kafka-tls-bad");
    let malformed = dir.join("malformed.pem");
    let key_text = std::fs::read_to_string(kafka.file("client.key")).unwrap();
    let body: String = key_text
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    std::fs::write(
        &malformed,
        format!("-----BEGIN PRIVATE KEY-----\n{body}!\n-----END PRIVATE KEY-----\n"),
    )
    .unwrap();
    let unreadable = dir.join("missing.pem");
    let ca = kafka.file("ca.crt");
    let (cert, key) = (kafka.file("client.crt"), kafka.file("client.key"));
    let ssl = [("KAFKA_SECURITY_PROTOCOL", "ssl".into())];
    let cases: Vec<(&str, Vec<(&str, PathBuf)>)> = vec![
        (
            "KAFKA_SSL_CA_LOCATION",
            vec![("KAFKA_SSL_CA_LOCATION", unreadable.clone())],
        ),
        (
            "KAFKA_SSL_CA_LOCATION",
            vec![("KAFKA_SSL_CA_LOCATION", key.clone())],
        ),
        (
            "KAFKA_SSL_KEY_LOCATION",
            vec![
                ("KAFKA_SSL_CA_LOCATION", ca.clone()),
                ("KAFKA_SSL_CERTIFICATE_LOCATION", cert.clone()),
                ("KAFKA_SSL_KEY_LOCATION", malformed.clone()),
            ],
        ),
        (
            "KAFKA_SSL_KEY_LOCATION",
            vec![
                ("KAFKA_SSL_CERTIFICATE_LOCATION", cert.clone()),
                ("KAFKA_SSL_KEY_LOCATION", kafka.file("stranger.key")),
            ],
        ),
        (
            "KAFKA_SSL_KEY_LOCATION",
            vec![("KAFKA_SSL_CERTIFICATE_LOCATION", cert.clone())],
        ),
    ];
    for (setting, files) in cases {
        let mut command = binary();
        command
            .arg("run")
            .env("DATABASE_URL", "postgres://u:pw@127.0.0.1:1/db")
            .env("KAFKA_BOOTSTRAP_SERVERS", kafka.listener(SSL))
            .env("RUST_LOG", "off");
        for (name, value) in ssl
            .iter()
            .map(|(n, v): &(&str, PathBuf)| (*n, v.clone()))
            .chain(files)
        {
            command.env(name, value);
        }
        let output = command.output().expect("run the binary");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{setting}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(setting), "{setting} in: {stderr}");
        assert!(
            !stderr.contains(&body[..20]) && !stderr.contains("PRIVATE KEY"),
            "{stderr}"
        );
        eprintln!("as expected: {}", stderr.trim_end());
    }
}
