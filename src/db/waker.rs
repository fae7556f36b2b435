//! The deadline waker's lease (`booking_expiration_waker`, one row): which
//! instance wakes at each deadline, until when, and whether it has due
//! rows left. One statement takes, renews or reads it.

use diesel::{
    QueryableByName,
    sql_types::{BigInt, Bool, Uuid as SqlUuid},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::DbError;

/// What one look at the lease found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, QueryableByName)]
pub struct WakerLease {
    /// This instance holds the lease (took or renewed it).
    #[diesel(sql_type = Bool)]
    pub mine: bool,
    /// Another instance holds it and says it has due rows left: help.
    #[diesel(sql_type = Bool)]
    pub busy: bool,
}

/// Takes the lease for `me` when it ran out (or is already `me`'s), for
/// `lease` from now on the database's clock, saying whether `me` has due
/// rows left; returns whether it is `me`'s and whether the holder is busy.
///
/// While another instance holds a live lease, the statement only reads
/// it: the insert is not tried, so the row is not locked (an `ON CONFLICT
/// DO UPDATE` locks the row it meets even when its `WHERE` turns the
/// update down), and the look takes no transaction id and commits
/// without a WAL flush. Every instance looks five times a second; only
/// the holder's renewal and a take write. The insert's own condition
/// still decides a race with a holder that renewed or let go meanwhile.
pub async fn hold(
    conn: &mut AsyncPgConnection,
    me: Uuid,
    lease: std::time::Duration,
    backlog: bool,
) -> Result<WakerLease, DbError> {
    Ok(diesel::sql_query(
        "WITH other AS ( \
             SELECT backlog FROM booking_expiration_waker \
              WHERE id = 1 AND owner <> $1 AND until >= statement_timestamp()), \
         taken AS ( \
             INSERT INTO booking_expiration_waker AS w (id, owner, until, backlog) \
             SELECT 1, $1, statement_timestamp() + $2 * interval '1 millisecond', $3 \
              WHERE NOT EXISTS (SELECT 1 FROM other) \
             ON CONFLICT (id) DO UPDATE \
                SET owner = EXCLUDED.owner, until = EXCLUDED.until, backlog = EXCLUDED.backlog \
              WHERE w.owner = EXCLUDED.owner OR w.until < statement_timestamp() \
             RETURNING w.owner) \
         SELECT EXISTS (SELECT 1 FROM taken) AS mine, \
                coalesce((SELECT backlog FROM other), false) AS busy",
    )
    .bind::<SqlUuid, _>(me)
    .bind::<BigInt, _>(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX))
    .bind::<Bool, _>(backlog)
    .get_result(conn)
    .await?)
}

/// Gives the lease up (`me` stops): another instance takes it at once.
pub async fn give_up(conn: &mut AsyncPgConnection, me: Uuid) -> Result<usize, DbError> {
    Ok(
        diesel::sql_query("DELETE FROM booking_expiration_waker WHERE owner = $1")
            .bind::<SqlUuid, _>(me)
            .execute(conn)
            .await?,
    )
}
