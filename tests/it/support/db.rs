//! A fresh, migrated database per test on the test PostgreSQL, dropped when
//! the test ends (passed or failed), and booking fixtures.

use std::{collections::BTreeMap, future::Future, sync::Arc, time::Duration};

use booking_expiration::context::TaskContext;
use booking_expiration::{
    clock::ManualClock,
    config::{DatabaseSettings, EventSettings, ExpirySettings, ShutdownSettings},
    db::{self, PgPool},
    expiry::ExpiryWorker,
};
use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::{admin_url, database_settings, expiry_settings};

/// The prefix of every test database's name (`scripts/test.sh` checks that
/// none is left after a run).
const TEST_DB_PREFIX: &str = "be_test_";

/// A database of its own for one test; dropped (`WITH (FORCE)`) on drop.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub settings: DatabaseSettings,
    pub pool: PgPool,
    admin: String,
}

impl TestDb {
    pub async fn new() -> Self {
        Self::on(&admin_url()).await
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
        let name = format!("{TEST_DB_PREFIX}{}", Uuid::new_v4().simple());
        let url = testkit::postgres::create_database(admin, &name)
            .await
            .expect("create the test database");
        let settings = database_settings(&url);
        let pool = db::build_pool(&settings);
        Self {
            name,
            url,
            settings,
            pool,
            admin: admin.to_owned(),
        }
    }

    pub async fn conn(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.url)
            .await
            .expect("connect to test database")
    }

    /// A session holding an `EXCLUSIVE` lock on the outbox in an open
    /// transaction: every batch's write waits on it until the session is
    /// dropped.
    pub async fn lock_outbox(&self) -> AsyncPgConnection {
        self.holding("LOCK TABLE booking_expiration_outbox IN EXCLUSIVE MODE")
            .await
    }

    /// A session that ran `sql` in a transaction it keeps open (the locks
    /// `sql` took are held) until the session is dropped.
    pub async fn holding(&self, sql: &str) -> AsyncPgConnection {
        let mut holder = self.conn().await;
        holder.begin_test_transaction().await.expect("begin");
        diesel::sql_query(sql)
            .execute(&mut holder)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        holder
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
            &TaskContext::new(self.pool.clone(), Arc::new(clock.clone())),
            settings,
            events,
            ShutdownSettings::default(),
        )
    }

    /// Outbox rows not yet published.
    pub async fn unpublished(&self) -> i64 {
        self.count("SELECT count(*) AS n FROM booking_expiration_outbox WHERE published_at IS NULL")
            .await
    }

    /// Waits until every outbox row is published.
    pub async fn wait_all_published(&self, timeout: Duration) {
        super::wait_until("every outbox row published", timeout, || async {
            self.unpublished().await == 0
        })
        .await;
    }

    /// How many of the worker's sessions on this database meet `condition`
    /// (SQL over `pg_stat_activity`, e.g. `wait_event_type = 'Lock'`).
    pub async fn worker_sessions(&self, condition: &str) -> i64 {
        self.count(&format!(
            "SELECT count(*) AS n FROM pg_stat_activity \
              WHERE datname = '{}' AND application_name = 'booking-expiration' AND ({condition})",
            self.name
        ))
        .await
    }

    pub async fn count(&self, sql: &str) -> i64 {
        let mut conn = self.conn().await;
        testkit::postgres::count(&mut conn, sql)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// The values of a one-column query (a column `name`), sorted.
    pub async fn names(&self, sql: &str) -> Vec<String> {
        #[derive(diesel::QueryableByName)]
        struct Name {
            #[diesel(sql_type = Text)]
            name: String,
        }
        let mut conn = self.conn().await;
        let rows: Vec<Name> = diesel::sql_query(sql)
            .load(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let mut out: Vec<String> = rows.into_iter().map(|r| r.name).collect();
        out.sort();
        out
    }

    /// Gives `role` the worker's grants, `deploy/postgres/grants.sql`, run
    /// as `as_url` (the owner of the tables, or a superuser).
    pub async fn grant_worker(&self, as_url: &str, role: &str) {
        const GRANTS_SQL: &str = include_str!("../../../deploy/postgres/grants.sql");
        let sql = GRANTS_SQL.replace("TO booking_expiration;", &format!("TO {role};"));
        testkit::postgres::exec(as_url, &sql)
            .await
            .unwrap_or_else(|e| panic!("grants.sql for {role}: {e:#}"));
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

impl Drop for TestDb {
    /// Drops the database when its test ends, also when the test panicked.
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        cleanup(&format!("test database {name}"), async move {
            testkit::postgres::drop_database(&admin, &name).await
        });
    }
}

/// Login roles of one test (roles belong to the whole server), dropped when
/// the test ends, after the databases that were made after them.
pub struct TestRoles {
    pub names: Vec<String>,
    admin: String,
}

impl TestRoles {
    /// Creates each role with `CREATE ROLE {name} {options}`; the names get
    /// a suffix of this test's own.
    pub async fn create(roles: &[(&str, &str)]) -> Self {
        let suffix = Uuid::new_v4().simple().to_string();
        let admin = admin_url();
        let mut names = Vec::new();
        for (name, options) in roles {
            let name = format!("be_test_{name}_{}", &suffix[..12]);
            testkit::postgres::exec(&admin, &format!("CREATE ROLE {name} {options}"))
                .await
                .expect("create a role");
            names.push(name);
        }
        Self { names, admin }
    }
}

impl Drop for TestRoles {
    fn drop(&mut self) {
        let (admin, names) = (self.admin.clone(), self.names.join(", "));
        cleanup(&format!("roles {names}"), async move {
            testkit::postgres::exec(&admin, &format!("DROP ROLE IF EXISTS {names}")).await
        });
    }
}

/// Runs a clean-up from `drop`, which may run on the test's runtime thread
/// (where blocking on a future panics): on a thread of its own with its own
/// runtime, bounded; a failure is reported, never raised (a panic while
/// unwinding would abort the whole test binary).
fn cleanup(what: &str, work: impl Future<Output = anyhow::Result<()>> + Send + 'static) {
    let dropper = std::thread::Builder::new()
        .name(format!("drop {what}"))
        .spawn(move || -> anyhow::Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async { tokio::time::timeout(Duration::from_secs(30), work).await? })
        });
    let outcome = match dropper {
        Ok(thread) => thread
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the dropping thread panicked"))),
        Err(error) => Err(error.into()),
    };
    if let Err(error) = outcome {
        eprintln!("warning: {what} not dropped: {error:#}");
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

/// `n` bookings falling due evenly over `spread` from `first`, each made
/// by `booking` from its deadline.
pub fn falling_due(
    n: u64,
    first: DateTime<Utc>,
    spread: Duration,
    booking: impl Fn(DateTime<Utc>) -> NewBooking,
) -> Vec<NewBooking> {
    let step = spread / n as u32;
    (0..n)
        .map(|i| {
            booking(
                first + chrono::Duration::from_std(step * i as u32).expect("a spread of seconds"),
            )
        })
        .collect()
}

async fn insert_booking(conn: &mut AsyncPgConnection, b: &NewBooking) {
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
