//! Shared test support: a fresh database per test on the PostgreSQL the
//! test command started, booking fixtures, a fresh Kafka topic per test and
//! a reader for it, and waiting on conditions with deadlines.
#![allow(dead_code)]

use std::{
    collections::BTreeMap,
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use booking_expiration::{
    clock::{Clock, ManualClock},
    config::{
        Compression, DatabaseSettings, DatabaseUrl, EventSettings, ExpirySettings, KafkaSettings,
        ShutdownSettings,
    },
    db::{self, PgPool},
    expiry::ExpiryWorker,
    telemetry::Metrics,
};
use chrono::{DateTime, TimeZone, Utc};
use diesel::{
    QueryableByName,
    sql_types::{BigInt, Nullable, Text, Timestamptz, Uuid as SqlUuid},
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

/// The admin URL given by the test command. Tests that need the database
/// fail loudly without it; they never skip.
pub fn admin_url() -> String {
    std::env::var("DATABASE_URL").expect(
        "DATABASE_URL is not set: run the tests with scripts/test.sh, which starts PostgreSQL and Kafka",
    )
}

pub fn kafka_bootstrap() -> Vec<String> {
    std::env::var("KAFKA_BOOTSTRAP_SERVERS")
        .expect("KAFKA_BOOTSTRAP_SERVERS is not set: run the tests with scripts/test.sh")
        .split(',')
        .map(str::to_owned)
        .collect()
}

pub fn database_settings(url: &str) -> DatabaseSettings {
    DatabaseSettings {
        url: DatabaseUrl::parse(url).expect("valid test URL"),
        pool_size: 8,
        connect_timeout: Duration::from_secs(5),
        statement_timeout: Duration::from_secs(30),
    }
}

/// A fixed, round reference time for deterministic tests.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2027, 3, 1, 12, 0, 0).unwrap()
}

pub fn expiry_settings(batch_size: u32) -> ExpirySettings {
    ExpirySettings {
        interval: Duration::from_secs(60),
        batch_size,
        max_batches_per_cycle: 1000,
        cycle_budget: Duration::from_secs(30),
        // Tests set the clock far from the database's on purpose.
        max_clock_skew: None,
    }
}

/// The default `ce_source` and the topic `topic`.
pub fn events_on(topic: &str) -> EventSettings {
    EventSettings {
        topic: topic.to_owned(),
        ..EventSettings::default()
    }
}

pub fn kafka_settings(bootstrap: Vec<String>) -> KafkaSettings {
    KafkaSettings {
        bootstrap_servers: bootstrap,
        client_id: "booking-expiration-test".into(),
        request_timeout: Duration::from_secs(10),
        create_topic: false,
        topic_partitions: 3,
        replication_factor: 1,
        compression: Compression::None,
        sasl: None,
    }
}

/// A database of its own for one test, migrated.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub settings: DatabaseSettings,
    pub pool: PgPool,
}

impl TestDb {
    pub async fn new() -> Self {
        let db = Self::empty().await;
        db::migrate::run_migrations(&db.settings)
            .await
            .expect("migrations apply");
        db
    }

    /// A fresh, migrated database on another server.
    pub async fn on(admin: &str) -> Self {
        let db = Self::empty_on(admin).await;
        db::migrate::run_migrations(&db.settings)
            .await
            .expect("migrations apply");
        db
    }

    /// A fresh database without the schema.
    pub async fn empty() -> Self {
        Self::empty_on(&admin_url()).await
    }

    async fn empty_on(admin: &str) -> Self {
        let admin = admin.to_owned();
        let name = format!("be_test_{}", Uuid::new_v4().simple());
        let mut conn = AsyncPgConnection::establish(&admin)
            .await
            .expect("connect to the test PostgreSQL");
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("create test database");
        let mut url = url::Url::parse(&admin).expect("admin URL");
        url.set_path(&format!("/{name}"));
        let url = url.to_string();
        let settings = database_settings(&url);
        let pool = db::build_pool(&settings);
        Self {
            name,
            url,
            settings,
            pool,
        }
    }

    pub async fn conn(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.url)
            .await
            .expect("connect to test database")
    }

    pub fn worker(&self, clock: &ManualClock, batch_size: u32) -> ExpiryWorker {
        self.worker_with(clock, expiry_settings(batch_size))
    }

    pub fn worker_with(&self, clock: &ManualClock, settings: ExpirySettings) -> ExpiryWorker {
        self.worker_for(clock, settings, EventSettings::default())
    }

    pub fn worker_for(
        &self,
        clock: &ManualClock,
        settings: ExpirySettings,
        events: EventSettings,
    ) -> ExpiryWorker {
        ExpiryWorker::new(
            self.pool.clone(),
            Arc::new(clock.clone()) as Arc<dyn Clock>,
            settings,
            events,
            ShutdownSettings::default(),
            Arc::new(Metrics::new()),
        )
    }

    pub async fn count(&self, sql: &str) -> i64 {
        #[derive(QueryableByName)]
        struct Count {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        let mut conn = self.conn().await;
        let row: Count = diesel::sql_query(sql)
            .get_result(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        row.n
    }

    pub async fn exec_sql(&self, sql: &str) {
        let mut conn = self.conn().await;
        diesel::sql_query(sql)
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    pub async fn booking(&self, id: Uuid) -> StoredBooking {
        let mut conn = self.conn().await;
        diesel::sql_query(
            "SELECT id, tenant_id, deal_id, property_object_id, status, reserve_expires_at, \
             booking_expires_at, expired_at, updated_at, version FROM bookings WHERE id = $1",
        )
        .bind::<SqlUuid, _>(id)
        .get_result(&mut conn)
        .await
        .expect("booking exists")
    }

    pub async fn all_bookings(&self) -> Vec<StoredBooking> {
        let mut conn = self.conn().await;
        diesel::sql_query(
            "SELECT id, tenant_id, deal_id, property_object_id, status, reserve_expires_at, \
             booking_expires_at, expired_at, updated_at, version FROM bookings ORDER BY id",
        )
        .load(&mut conn)
        .await
        .expect("bookings")
    }

    pub async fn bookings_by_id(&self) -> BTreeMap<Uuid, StoredBooking> {
        self.all_bookings()
            .await
            .into_iter()
            .map(|b| (b.id, b))
            .collect()
    }

    pub async fn insert(&self, booking: &NewBooking) {
        let mut conn = self.conn().await;
        insert_booking(&mut conn, booking).await;
    }

    pub async fn insert_all(&self, bookings: &[NewBooking]) {
        let mut conn = self.conn().await;
        for booking in bookings {
            insert_booking(&mut conn, booking).await;
        }
    }

    /// `n` due bookings of each active status mix, deadlines before `as_of`.
    pub async fn seed_due(&self, n: u64, as_of: DateTime<Utc>) {
        let mut conn = self.conn().await;
        db::seed::seed(
            &mut conn,
            &db::seed::SeedPlan {
                active: n,
                due_fraction: 1.0,
                inactive: 0,
                poison: 0,
                as_of,
                spread: Duration::from_secs(600),
            },
        )
        .await
        .expect("seed");
    }
}

/// A stored booking, for assertions: the repository's own row type.
pub type StoredBooking = booking_expiration::db::bookings::BookingRow;

/// A booking to insert.
#[derive(Debug, Clone)]
pub struct NewBooking {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub deal_id: Option<Uuid>,
    pub property_object_id: Option<Uuid>,
    pub status: String,
    pub reserve_expires_at: Option<DateTime<Utc>>,
    pub booking_expires_at: Option<DateTime<Utc>>,
    pub version: i64,
}

impl NewBooking {
    pub fn new(status: &str) -> Self {
        Self {
            id: Uuid::new_v4(),
            tenant_id: Uuid::new_v4(),
            deal_id: Some(Uuid::new_v4()),
            property_object_id: Some(Uuid::new_v4()),
            status: status.to_owned(),
            reserve_expires_at: None,
            booking_expires_at: None,
            version: 1,
        }
    }

    pub fn reserve_deadline(mut self, at: DateTime<Utc>) -> Self {
        self.reserve_expires_at = Some(at);
        self
    }

    pub fn booking_deadline(mut self, at: DateTime<Utc>) -> Self {
        self.booking_expires_at = Some(at);
        self
    }

    pub fn without_deal(mut self) -> Self {
        self.deal_id = None;
        self
    }

    pub fn without_property_object(mut self) -> Self {
        self.property_object_id = None;
        self
    }
}

pub async fn insert_booking(conn: &mut AsyncPgConnection, b: &NewBooking) {
    diesel::sql_query(
        "INSERT INTO bookings (id, tenant_id, deal_id, property_object_id, status, \
         reserve_expires_at, booking_expires_at, created_at, updated_at, version) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, '2027-01-01T00:00:00Z', '2027-01-01T00:00:00Z', $8)",
    )
    .bind::<SqlUuid, _>(b.id)
    .bind::<SqlUuid, _>(b.tenant_id)
    .bind::<Nullable<SqlUuid>, _>(b.deal_id)
    .bind::<Nullable<SqlUuid>, _>(b.property_object_id)
    .bind::<Text, _>(&b.status)
    .bind::<Nullable<Timestamptz>, _>(b.reserve_expires_at)
    .bind::<Nullable<Timestamptz>, _>(b.booking_expires_at)
    .bind::<BigInt, _>(b.version)
    .execute(conn)
    .await
    .expect("insert booking");
}

/// Polls `condition` every 50 ms until it holds or `timeout` passes.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One record read back from Kafka.
#[derive(Debug, Clone)]
pub struct ConsumedRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub value: Vec<u8>,
    pub headers: BTreeMap<String, Vec<u8>>,
}

impl ConsumedRecord {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

pub async fn kafka_client() -> rskafka::client::Client {
    kafka_client_for(kafka_bootstrap()).await
}

pub async fn kafka_client_for(bootstrap: Vec<String>) -> rskafka::client::Client {
    rskafka::client::ClientBuilder::new(bootstrap)
        .build()
        .await
        .expect("connect to the test Kafka broker")
}

/// Creates a fresh topic with `partitions` partitions and returns its name.
pub async fn create_topic(partitions: i32) -> String {
    let name = format!("test-booking-expired-{}", Uuid::new_v4().simple());
    let client = kafka_client().await;
    client
        .controller_client()
        .expect("controller client")
        .create_topic(&name, partitions, 1, 10_000)
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
    use rskafka::client::partition::UnknownTopicHandling;
    let client = kafka_client_for(bootstrap).await;
    let mut out = Vec::new();
    for partition in 0..partitions {
        let pc = client
            .partition_client(topic, partition, UnknownTopicHandling::Retry)
            .await
            .expect("partition client");
        let mut offset = 0;
        loop {
            let (records, high_watermark) = pc
                .fetch_records(offset, 1..5_000_000, 500)
                .await
                .expect("fetch");
            for r in &records {
                out.push(ConsumedRecord {
                    partition,
                    offset: r.offset,
                    key: String::from_utf8(r.record.key.clone().unwrap_or_default())
                        .expect("utf8 key"),
                    value: r.record.value.clone().unwrap_or_default(),
                    headers: r.record.headers.clone(),
                });
            }
            if let Some(last) = records.last() {
                offset = last.offset + 1;
            }
            if records.is_empty() || offset >= high_watermark {
                break;
            }
        }
    }
    out
}

/// The manual clock at `t0()`.
pub fn clock() -> ManualClock {
    ManualClock::new(t0())
}

/// The partitions the Java client computes for `keys`, by running Kafka's
/// own `Utils.murmur2` from the broker's jars (scripts/kafka.sh partition).
pub fn java_partitions(keys: &[String], partitions: i32) -> BTreeMap<String, i32> {
    use std::io::Write;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka.sh");
    let mut child = std::process::Command::new("bash")
        .args([script, "partition", "--partitions", &partitions.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run scripts/kafka.sh partition");
    {
        let stdin = child.stdin.as_mut().expect("stdin");
        for key in keys {
            writeln!(stdin, "{key}").expect("write key");
        }
    }
    let output = child.wait_with_output().expect("partition output");
    assert!(output.status.success(), "scripts/kafka.sh partition failed");
    String::from_utf8(output.stdout)
        .expect("utf8")
        .lines()
        .map(|line| {
            let (key, partition) = line.split_once('\t').expect("KEY\tPARTITION");
            (
                key.to_owned(),
                partition.trim().parse().expect("partition number"),
            )
        })
        .collect()
}

/// The binary under test.
pub fn binary() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_booking-expiration"));
    for name in [
        "DATABASE_URL",
        "KAFKA_BOOTSTRAP_SERVERS",
        "KAFKA_TOPIC",
        "EXPIRATION_INTERVAL",
        "EXPIRATION_BATCH_SIZE",
        "METRICS_ADDR",
    ] {
        command.env_remove(name);
    }
    command.env("RUST_LOG", "info");
    command
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A plain HTTP GET; returns (status, body), or None while nothing listens.
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// Waits until `GET path` answers with `status`.
pub async fn wait_http_status(addr: &str, path: &str, status: u16, timeout: Duration) {
    wait_until(&format!("{path} to answer {status}"), timeout, || async {
        http_get(addr, path).await.is_some_and(|(s, _)| s == status)
    })
    .await;
}

/// Sends SIGTERM to a child process.
pub fn terminate(child: &std::process::Child) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// Waits for a child to exit, killing it after `timeout`.
pub async fn wait_exit(
    child: &mut std::process::Child,
    timeout: Duration,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("process did not exit within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A running binary: its stderr is drained on a thread (a full pipe would
/// block the process) and it is killed if the test fails before stopping it.
pub struct Running {
    pub child: std::process::Child,
    stderr: Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    pub fn spawn(mut command: std::process::Command) -> Self {
        command.stderr(std::process::Stdio::piped());
        let mut child = command.spawn().expect("spawn the binary");
        let mut pipe = child.stderr.take().expect("stderr pipe");
        let stderr = Arc::new(std::sync::Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            let reader = std::io::BufReader::new(&mut pipe);
            for line in reader.lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        Self {
            child,
            stderr,
            reader: Some(reader),
        }
    }

    /// Everything written to stderr so far (all of it once exited).
    pub fn stderr(&mut self) -> String {
        if self.child.try_wait().ok().flatten().is_some()
            && let Some(reader) = self.reader.take()
        {
            let _ = reader.join();
        }
        self.stderr.lock().unwrap().clone()
    }

    pub fn terminate(&self) {
        terminate(&self.child);
    }

    pub async fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        wait_exit(&mut self.child, timeout).await
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `bash scripts/NAME ARGS...`, fails the test with its stderr when it
/// fails, and returns its stdout.
pub fn run_script(name: &str, args: &[&str]) -> String {
    let path = format!("{}/scripts/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("bash")
        .arg(&path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {path}: {e}"));
    assert!(
        out.status.success(),
        "{name} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a closure on drop (stops servers a test started, even on failure).
pub struct Defer(pub Option<Box<dyn FnOnce()>>);

impl Drop for Defer {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// A fresh directory the `postgres` OS user can enter.
pub fn tempdir(prefix: &str) -> String {
    let dir = std::env::temp_dir().join(format!("be-{prefix}-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let _ = std::process::Command::new("chmod")
        .args(["755", dir.to_str().unwrap()])
        .status();
    dir.to_string_lossy().into_owned()
}

/// A free port whose successor is free too (Kafka's controller port).
pub fn free_port_pair() -> u16 {
    loop {
        let port = free_port();
        if port < 65000 && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}
