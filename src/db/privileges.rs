//! Least privilege: the grants each command needs, checked when it starts,
//! so that a missing grant is one line naming the table and the privilege
//! rather than a statement failing midway (PostgreSQL's own "permission
//! denied for table …", SQLSTATE 42501, names no privilege).
//!
//! [`GRANTS`] is the whole list for the worker's role; the SQL that grants
//! exactly it is `deploy/postgres/grants.sql` (docs/security.md), and
//! `tests/it/privileges.rs` runs every command with a role holding only
//! those grants, then takes each away in turn. The worker never owns or
//! alters crm's `bookings`: it reads it and updates four columns.
//! `migrate` runs as a separate owner role (docs/security.md), which is
//! not checked here: it creates the tables the grants name.

use diesel::{QueryableByName, sql_types::Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use super::{DbError, PgPool};

/// What a command does with the database, for [`needed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Expiring bookings (`once`, and `run` unless `NO_WORKER`).
    Expire,
    /// The deadline waker's lease (`run` unless `NO_WORKER`).
    Wake,
    /// Publishing the outbox (`run` unless `NO_PUBLISHER`): claim, mark,
    /// park, retention.
    Publish,
    /// The outbox lag gauges every `run` keeps.
    Lag,
    /// `status`.
    Status,
    /// `outbox retry`.
    Unpark,
    /// `republish` (also `--dry-run`, which reads only: it needs the same
    /// grants, as it checks what a real run would write).
    Republish,
}

/// One privilege on one table, or on some of its columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub table: &'static str,
    pub privilege: &'static str,
    /// Empty: on the whole table.
    pub columns: &'static [&'static str],
    /// The uses that need it.
    pub needed_by: &'static [Use],
}

/// The bookings columns the worker writes (spec §3: status, expired_at,
/// updated_at, version).
pub const BOOKINGS_UPDATED_COLUMNS: &[&str] = &["status", "expired_at", "updated_at", "version"];

/// Every grant of the worker's role.
pub const GRANTS: &[Grant] = &[
    Grant {
        table: "bookings",
        privilege: "SELECT",
        columns: &[],
        needed_by: &[Use::Expire, Use::Status, Use::Republish],
    },
    Grant {
        table: "bookings",
        privilege: "UPDATE",
        columns: BOOKINGS_UPDATED_COLUMNS,
        needed_by: &[Use::Expire],
    },
    Grant {
        table: "booking_expiration_audit",
        privilege: "INSERT",
        columns: &[],
        needed_by: &[Use::Expire],
    },
    Grant {
        table: "booking_expiration_audit",
        privilege: "SELECT",
        columns: &[],
        needed_by: &[Use::Republish],
    },
    Grant {
        table: "booking_expiration_outbox",
        privilege: "INSERT",
        columns: &[],
        needed_by: &[Use::Expire, Use::Republish],
    },
    Grant {
        table: "booking_expiration_outbox",
        privilege: "SELECT",
        columns: &[],
        // An expiry's insert returns the new rows' ids and event ids
        // (`RETURNING` needs SELECT on what it names).
        needed_by: &[
            Use::Expire,
            Use::Publish,
            Use::Lag,
            Use::Status,
            Use::Unpark,
            Use::Republish,
        ],
    },
    Grant {
        table: "booking_expiration_outbox",
        privilege: "UPDATE",
        columns: &[],
        needed_by: &[Use::Publish, Use::Unpark],
    },
    Grant {
        table: "booking_expiration_outbox",
        privilege: "DELETE",
        columns: &[],
        needed_by: &[Use::Publish],
    },
    Grant {
        table: "booking_expiration_outbox_event",
        privilege: "INSERT",
        columns: &[],
        needed_by: &[Use::Expire, Use::Republish],
    },
    Grant {
        table: "booking_expiration_outbox_event",
        privilege: "SELECT",
        columns: &[],
        needed_by: &[Use::Publish, Use::Republish],
    },
    Grant {
        table: "booking_expiration_outbox_event",
        privilege: "DELETE",
        columns: &[],
        needed_by: &[Use::Publish],
    },
    Grant {
        table: "booking_expiration_waker",
        privilege: "SELECT",
        columns: &[],
        needed_by: &[Use::Wake],
    },
    Grant {
        table: "booking_expiration_waker",
        privilege: "INSERT",
        columns: &[],
        needed_by: &[Use::Wake],
    },
    Grant {
        table: "booking_expiration_waker",
        privilege: "UPDATE",
        columns: &[],
        needed_by: &[Use::Wake],
    },
    Grant {
        table: "booking_expiration_waker",
        privilege: "DELETE",
        columns: &[],
        needed_by: &[Use::Wake],
    },
    Grant {
        table: "booking_expiration_outbox_lag",
        privilege: "SELECT",
        columns: &[],
        needed_by: &[Use::Lag],
    },
    Grant {
        table: "booking_expiration_outbox_lag",
        privilege: "UPDATE",
        columns: &[],
        needed_by: &[Use::Lag],
    },
    Grant {
        table: "booking_expiration_topic_layout",
        privilege: "SELECT",
        columns: &[],
        needed_by: &[Use::Expire, Use::Publish, Use::Republish],
    },
    Grant {
        table: "booking_expiration_topic_layout",
        privilege: "INSERT",
        columns: &[],
        needed_by: &[Use::Publish],
    },
    Grant {
        table: "booking_expiration_topic_layout",
        privilege: "UPDATE",
        columns: &[],
        needed_by: &[Use::Publish],
    },
];

/// The grants `uses` need, each once, in [`GRANTS`] order.
pub fn needed(uses: &[Use]) -> Vec<&'static Grant> {
    GRANTS
        .iter()
        .filter(|grant| grant.needed_by.iter().any(|u| uses.contains(u)))
        .collect()
}

/// A grant the connected role lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the database role {role:?} lacks {privilege} on table {table}{columns} \
     (the worker's grants: docs/security.md, deploy/postgres/grants.sql)"
)]
pub struct MissingGrant {
    pub role: String,
    pub table: String,
    pub privilege: String,
    /// ` (status, version)` for a column grant, else empty.
    pub columns: String,
}

#[derive(QueryableByName)]
struct Missing {
    #[diesel(sql_type = Text)]
    role: String,
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    privilege: String,
    #[diesel(sql_type = Text)]
    columns: String,
}

/// [`check`] on a pooled connection.
pub async fn check_pooled(pool: &PgPool, uses: &[Use]) -> Result<(), DbError> {
    let mut conn = pool.get().await?;
    check(&mut conn, uses).await
}

/// Checks, in a transaction of its own (see [`super`]), that the connected
/// role holds every grant `uses` need; the first one missing is the error.
/// A table that does not exist is reported as missing too (its check
/// cannot pass): `migrate` creates it.
pub async fn check(conn: &mut AsyncPgConnection, uses: &[Use]) -> Result<(), DbError> {
    conn.transaction(async |conn| first_missing(conn, uses).await)
        .await
}

async fn first_missing(conn: &mut AsyncPgConnection, uses: &[Use]) -> Result<(), DbError> {
    let grants = needed(uses);
    let tables: Vec<&str> = grants.iter().map(|g| g.table).collect();
    let privileges: Vec<&str> = grants.iter().map(|g| g.privilege).collect();
    let columns: Vec<String> = grants.iter().map(|g| g.columns.join(",")).collect();
    // One row per grant, in order; each column of a column grant checked
    // on its own (a table-wide grant covers them all).
    let missing: Vec<Missing> = diesel::sql_query(
        "SELECT current_user::text AS role, t.table_name, t.privilege, t.columns \
           FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY \
                AS t(table_name, privilege, columns, n) \
          WHERE to_regclass(t.table_name) IS NULL \
             OR (t.columns = '' AND NOT has_table_privilege(t.table_name, t.privilege)) \
             OR (t.columns <> '' AND EXISTS ( \
                   SELECT 1 FROM unnest(string_to_array(t.columns, ',')) AS c(name) \
                    WHERE NOT has_column_privilege(t.table_name, c.name, t.privilege))) \
          ORDER BY t.n LIMIT 1",
    )
    .bind::<diesel::sql_types::Array<Text>, _>(&tables)
    .bind::<diesel::sql_types::Array<Text>, _>(&privileges)
    .bind::<diesel::sql_types::Array<Text>, _>(&columns)
    .load(conn)
    .await?;
    match missing.into_iter().next() {
        None => Ok(()),
        Some(row) => Err(DbError::MissingGrant(MissingGrant {
            role: row.role,
            table: row.table_name,
            privilege: row.privilege,
            columns: if row.columns.is_empty() {
                String::new()
            } else {
                format!(" ({})", row.columns.replace(',', ", "))
            },
        })),
    }
}

/// PostgreSQL's insufficient_privilege (42501), told by its message
/// ("permission denied for table bookings"; diesel keeps no SQLSTATE), as
/// the words that say what to do; empty for any other error. The message
/// itself, which names the table, follows in the error's cause.
pub fn hint(error: &diesel::result::Error) -> &'static str {
    match error {
        diesel::result::Error::DatabaseError(_, info)
            if info.message().starts_with("permission denied for ") =>
        {
            " (the database role lacks a grant; docs/security.md and \
             deploy/postgres/grants.sql list the worker's grants)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_use_needs_what_its_statements_do() {
        let names = |uses: &[Use]| -> Vec<String> {
            needed(uses)
                .iter()
                .map(|g| format!("{} {}", g.privilege, g.table))
                .collect()
        };
        assert_eq!(
            names(&[Use::Status]),
            ["SELECT bookings", "SELECT booking_expiration_outbox"]
        );
        assert_eq!(
            names(&[Use::Unpark]),
            [
                "SELECT booking_expiration_outbox",
                "UPDATE booking_expiration_outbox"
            ]
        );
        assert_eq!(
            names(&[Use::Expire]),
            [
                "SELECT bookings",
                "UPDATE bookings",
                "INSERT booking_expiration_audit",
                "INSERT booking_expiration_outbox",
                "SELECT booking_expiration_outbox",
                "INSERT booking_expiration_outbox_event",
                "SELECT booking_expiration_topic_layout"
            ]
        );
        // Nothing is ever needed on bookings but reading it and updating
        // the worker's four columns.
        for grant in GRANTS.iter().filter(|g| g.table == "bookings") {
            assert!(
                grant.privilege == "SELECT"
                    || (grant.privilege == "UPDATE" && grant.columns == BOOKINGS_UPDATED_COLUMNS),
                "{grant:?}"
            );
        }
        // Every use needs something, and every grant is needed.
        for grant in GRANTS {
            assert!(!grant.needed_by.is_empty(), "{grant:?}");
        }
    }

    #[test]
    fn a_permission_error_at_run_time_points_to_the_grants() {
        use diesel::result::{DatabaseErrorKind, Error};
        let denied = Error::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new("permission denied for table bookings".to_owned()),
        );
        let error = DbError::Query(denied);
        assert_eq!(
            error.to_string(),
            "statement failed (the database role lacks a grant; docs/security.md and \
             deploy/postgres/grants.sql list the worker's grants)"
        );
        let other = DbError::Query(Error::NotFound);
        assert_eq!(other.to_string(), "statement failed");
    }
}
