//! The pipeline's database side: one round is one short transaction that
//! marks the acknowledged rows published (or deletes them at retention
//! zero), parks the refused ones, renews or releases leases, and claims new
//! rows. The [`Store`] seam lets tests drive the pipeline on an in-memory
//! outbox with paused time; [`PgStore`] is the real one (the SQL lives in
//! `db::outbox`).

use std::{future::Future, sync::Arc};

use diesel_async::AsyncConnection;

use crate::{
    clock::Clock,
    db::{
        DbError, PgPool,
        outbox::{self, Claim, ClaimedRow},
    },
};

/// The work of one database round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Round {
    /// Rows the broker acknowledged.
    pub published: Vec<i64>,
    /// Rows the broker refused for good, with the reason.
    pub parked: Vec<(i64, String)>,
    /// Rows still held whose lease is renewed (for `lease`).
    pub renew: Vec<i64>,
    /// The lease of renewed and claimed rows.
    pub lease: std::time::Duration,
    /// Rows this instance gives up (it stops): another may claim them.
    pub release: Vec<i64>,
    /// New rows to claim.
    pub claim: Option<Claim>,
}

impl Round {
    pub fn is_empty(&self) -> bool {
        self.published.is_empty()
            && self.parked.is_empty()
            && self.renew.is_empty()
            && self.release.is_empty()
            && self.claim.is_none()
    }
}

/// Where the pipeline keeps the outbox.
pub trait Store: Send + Sync + 'static {
    /// Runs `round` in one transaction; returns the claimed rows, oldest
    /// first. On error nothing of it took effect.
    fn round(&self, round: Round) -> impl Future<Output = Result<Vec<ClaimedRow>, DbError>> + Send;
}

/// The outbox in PostgreSQL.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    clock: Arc<dyn Clock>,
    /// Retention zero: acknowledged rows are deleted, not marked.
    delete_published: bool,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("delete_published", &self.delete_published)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    pub fn new(pool: PgPool, clock: Arc<dyn Clock>, delete_published: bool) -> Self {
        Self {
            pool,
            clock,
            delete_published,
        }
    }
}

impl Store for PgStore {
    async fn round(&self, round: Round) -> Result<Vec<ClaimedRow>, DbError> {
        let mut conn = self.pool.get().await?;
        let now = self.clock.now();
        conn.transaction(async |conn| {
            if !round.published.is_empty() {
                if self.delete_published {
                    outbox::delete_rows(conn, &round.published).await?;
                } else {
                    outbox::mark_published(conn, &round.published, now).await?;
                }
            }
            for (id, reason) in &round.parked {
                outbox::park(conn, *id, reason, now).await?;
            }
            if !round.renew.is_empty() {
                outbox::renew(conn, &round.renew, round.lease).await?;
            }
            if !round.release.is_empty() {
                outbox::release(conn, &round.release).await?;
            }
            match &round.claim {
                Some(claim) => outbox::claim(conn, claim).await,
                None => Ok(Vec::new()),
            }
        })
        .await
    }
}
