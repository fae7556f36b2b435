//! Past one database: crm sharded by tenant, one deployment per database
//! (docs/scaling.md). Two PostgreSQL clusters, the test command's and one
//! started here with `scripts/postgres.sh`, each hold the bookings of their
//! own tenants; each has its own group of two `run` processes, at their
//! defaults but for the topic; both groups publish into one topic.
//!
//! A consumer must see one stream: every expiry of both shards on the
//! topic, every `ce_id` unique to one event (a copy only as the same bytes),
//! each record on the partition Kafka's Java client computes for its key,
//! and nothing in a record that tells which database it came from: the
//! same headers with the same constant values, values that decode with the
//! consumer crate and agree with their headers.
//!
//! Why two clusters and not two databases on one server: the worker sees
//! no difference (each deployment has its own `DATABASE_URL`, its own
//! commit notifications, its own outbox sequence), but two servers are
//! what a sharded crm has: separate sequences and transaction ids, clocks
//! read from separate servers, a notification on one never reaching the
//! other. A second throwaway cluster costs a few seconds, so the test
//! takes the real shape rather than argue it away.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use booking_expired_proto::{decode_record, headers};
use diesel::{QueryableByName, sql_types::Text};
use diesel_async::RunQueryDsl;
use testkit::postgres::Postgres;
use uuid::Uuid;

use crate::support::*;

/// Bookings per shard: deadlines from 2 s before the workers start to 4 s
/// after, so both groups expire and publish at the same time.
const PER_SHARD: i64 = 1_500;
const PARTITIONS: i32 = 3;

#[derive(QueryableByName)]
struct OutboxEvent {
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = Text)]
    message_key: String,
}

/// One shard: its database, its tenants.
struct Shard {
    name: &'static str,
    db: TestDb,
    tenants: [Uuid; 2],
}

impl Shard {
    async fn seed(&self) {
        let [a, b] = self.tenants;
        self.db
            .exec_sql(&format!(
                "INSERT INTO bookings (id, tenant_id, deal_id, property_object_id, status, \
                   reserve_expires_at, booking_expires_at) \
                 SELECT gen_random_uuid(), \
                   CASE WHEN i % 2 = 0 THEN '{a}'::uuid ELSE '{b}'::uuid END, \
                   gen_random_uuid(), gen_random_uuid(), \
                   (ARRAY['Reserved', 'AwaitingPayment', 'Booked'])[1 + i % 3], \
                   CASE WHEN i % 3 < 2 THEN deadline END, \
                   CASE WHEN i % 3 = 2 THEN deadline END \
                 FROM (SELECT i, now() + ((i % 60) - 20) * interval '100 milliseconds' AS deadline \
                       FROM generate_series(1, {PER_SHARD}) AS i) AS s"
            ))
            .await;
    }

    /// The event ids of this shard's outbox, by key.
    async fn outbox(&self) -> BTreeMap<String, String> {
        let mut conn = self.db.conn().await;
        diesel::sql_query(
            "SELECT event_id::text AS event_id, message_key FROM booking_expiration_outbox",
        )
        .load::<OutboxEvent>(&mut conn)
        .await
        .expect("read the outbox")
        .into_iter()
        .map(|row| (row.message_key, row.event_id))
        .collect()
    }

    async fn active(&self) -> i64 {
        self.db
            .count(
                "SELECT count(*) AS n FROM bookings \
                 WHERE status IN ('Reserved', 'AwaitingPayment', 'Booked')",
            )
            .await
    }

    /// `run` at its defaults on this shard's database, into `topic`.
    fn worker(&self, topic: &str) -> Running {
        let mut command = binary();
        command
            .arg("run")
            .env("DATABASE_URL", &self.db.url)
            .env("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap().join(","))
            .env("KAFKA_TOPIC", topic)
            .env("METRICS_ADDR", format!("127.0.0.1:{}", free_port()))
            .env("RUST_LOG", "warn");
        Running::spawn(command)
    }
}

/// Invariant: two deployments, each on its own database, publishing into
/// one topic make one stream that a consumer cannot tell apart from one
/// deployment's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_databases_two_worker_groups_one_topic_one_stream() {
    let second = Postgres::start(
        &tempdir("pg-shard-b"),
        free_port(),
        &["-c", "fsync=off", "-c", "synchronous_commit=off"],
    )
    .expect("start the second PostgreSQL");
    let shards = [
        Shard {
            name: "shard A (the test PostgreSQL)",
            db: TestDb::new().await,
            tenants: [Uuid::new_v4(), Uuid::new_v4()],
        },
        Shard {
            name: "shard B (a second PostgreSQL)",
            db: TestDb::on(&second.admin_url).await,
            tenants: [Uuid::new_v4(), Uuid::new_v4()],
        },
    ];
    let topic = create_topic(PARTITIONS).await;
    for shard in &shards {
        shard.seed().await;
    }

    let mut workers: Vec<(usize, Running)> = (0..2)
        .flat_map(|_| shards.iter().enumerate())
        .map(|(i, shard)| (i, shard.worker(&topic)))
        .collect();
    for shard in &shards {
        wait_until(
            &format!("{}: every booking expired and published", shard.name),
            Duration::from_secs(120),
            || async { shard.active().await == 0 && shard.db.unpublished().await == 0 },
        )
        .await;
    }
    for (_, worker) in &workers {
        worker.terminate();
    }
    for (shard, worker) in &mut workers {
        let status = worker.wait(Duration::from_secs(30)).await;
        assert_eq!(
            status.code(),
            Some(0),
            "{}: {}",
            shards[*shard].name,
            worker.stderr()
        );
    }

    // The database side: each shard expired its own bookings once each.
    let mut events_of: Vec<BTreeMap<String, String>> = Vec::new();
    for shard in &shards {
        assert_eq!(
            shard
                .db
                .count("SELECT count(*) AS n FROM booking_expiration_audit")
                .await,
            PER_SHARD,
            "{}: one audit row per booking",
            shard.name
        );
        let outbox = shard.outbox().await;
        assert_eq!(
            outbox.len() as i64,
            PER_SHARD,
            "{}: one outbox row per booking",
            shard.name
        );
        events_of.push(outbox);
    }
    let ids_a: BTreeSet<&String> = events_of[0].values().collect();
    let ids_b: BTreeSet<&String> = events_of[1].values().collect();
    assert!(
        ids_a.is_disjoint(&ids_b),
        "an event id written by both shards"
    );
    let shard_of_key: BTreeMap<&String, usize> = events_of
        .iter()
        .enumerate()
        .flat_map(|(i, outbox)| outbox.keys().map(move |key| (key, i)))
        .collect();
    assert_eq!(
        shard_of_key.len() as i64,
        2 * PER_SHARD,
        "a key in both shards"
    );

    // The topic: one stream.
    let records = read_topic(&topic, PARTITIONS).await;
    let keys: Vec<String> = shard_of_key.keys().map(|key| (*key).clone()).collect();
    let java = java_partitions(&keys, PARTITIONS);
    let mut by_id: BTreeMap<String, Vec<&ConsumedRecord>> = BTreeMap::new();
    let mut header_names: Vec<BTreeSet<BTreeSet<String>>> = vec![BTreeSet::new(), BTreeSet::new()];
    let mut constants: BTreeSet<Vec<Option<String>>> = BTreeSet::new();
    let mut per_partition: BTreeMap<(usize, i32), usize> = BTreeMap::new();
    for record in &records {
        let ce_id = record
            .header(headers::ID)
            .expect("every record has a ce_id");
        by_id.entry(ce_id.clone()).or_default().push(record);
        let shard = *shard_of_key
            .get(&record.key)
            .unwrap_or_else(|| panic!("a record whose key no shard expired: {}", record.key));
        assert_eq!(
            events_of[shard][&record.key], ce_id,
            "{}: the record of {} carries the outbox row's event id",
            shards[shard].name, record.key
        );
        assert_eq!(
            record.partition, java[&record.key],
            "{}: {} not on the Java client's partition",
            shards[shard].name, record.key
        );
        *per_partition.entry((shard, record.partition)).or_default() += 1;
        let event = decode_record(
            &record.value,
            record
                .headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_slice())),
        )
        .unwrap_or_else(|e| {
            panic!(
                "{}: a record a consumer cannot decode: {e}",
                shards[shard].name
            )
        });
        assert_eq!(event.booking_id.to_string(), record.key);
        assert_eq!(
            record.header(headers::TENANT_ID),
            Some(event.tenant_id.to_string())
        );
        assert!(
            shards[shard].tenants.contains(&event.tenant_id),
            "{}: a tenant of another shard",
            shards[shard].name
        );
        header_names[shard].insert(record.headers.keys().cloned().collect());
        constants.insert(vec![
            record.header(headers::SPEC_VERSION),
            record.header(headers::SOURCE),
            record.header(headers::TYPE),
            record.header(headers::CONTENT_TYPE),
            Some(event.message.contract_version.to_string()),
            Some(event.message.aggregate_type.clone()),
        ]);
    }
    let mut copies = 0;
    for (ce_id, same) in &by_id {
        for record in same {
            assert_eq!(
                (&record.key, &record.value, &record.headers),
                (&same[0].key, &same[0].value, &same[0].headers),
                "{ce_id}: two records with one ce_id differ"
            );
        }
        copies += same.len() - 1;
    }
    let on_topic: BTreeSet<&String> = by_id.keys().collect();
    let written: BTreeSet<&String> = ids_a.union(&ids_b).copied().collect();
    assert_eq!(
        on_topic, written,
        "the topic holds exactly the events of both shards"
    );
    assert_eq!(
        header_names[0], header_names[1],
        "the shards' records carry other headers"
    );
    assert_eq!(
        constants.len(),
        1,
        "ce_specversion, ce_source, ce_type, content-type, the contract version and the \
         aggregate type differ between records: {constants:?}"
    );
    for (i, shard) in shards.iter().enumerate() {
        for partition in 0..PARTITIONS {
            assert!(
                per_partition.get(&(i, partition)).is_some_and(|n| *n > 0),
                "{}: no record on partition {partition}",
                shard.name
            );
        }
    }
    eprintln!(
        "FIGURES shards: 2 databases on 2 PostgreSQL clusters, 2 run processes each, one topic of \
         {PARTITIONS} partitions: {} events ({PER_SHARD} per shard), {} records, {copies} copies \
         (same ce_id and bytes), records per (shard, partition) {per_partition:?}",
        by_id.len(),
        records.len()
    );
}
