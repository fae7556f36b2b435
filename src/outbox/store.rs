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
        outbox::{self, Claim},
    },
    handoff::{LeaseOwner, LeasedRow},
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
    /// Topics' partition counts read from the brokers, for writers to give
    /// new rows their partition, and for rows written for another count (or
    /// none) to be laid out anew, [`RELAYOUT_BATCH`] a round.
    pub layouts: Vec<(String, i32)>,
}

impl Round {
    pub fn is_empty(&self) -> bool {
        self.published.is_empty()
            && self.parked.is_empty()
            && self.renew.is_empty()
            && self.release.is_empty()
            && self.claim.is_none()
            && self.layouts.is_empty()
    }
}

/// Rows laid out anew per topic and round at most: a short transaction
/// even over the backlog of an outage written before the layout was known.
pub const RELAYOUT_BATCH: u32 = 5_000;

/// What a round found.
#[derive(Debug, Default)]
pub struct RoundResult {
    /// The claimed rows, oldest first.
    pub claimed: Vec<LeasedRow>,
    /// Rows of [`Round::renew`] whose lease is no longer this instance's
    /// (it was paused past the lease and another instance claimed them):
    /// they are not sent by this instance again.
    pub lost: Vec<i64>,
    /// Topics of [`Round::layouts`] with rows still to lay out (a full
    /// batch was laid out).
    pub relayout_left: Vec<String>,
}

/// Where the pipeline keeps the outbox.
pub trait Store: Send + Sync + 'static {
    /// Runs `round` in one transaction, touching only the rows whose lease
    /// [`Store::owner`] holds (and claiming new ones for it). On error
    /// nothing of it took effect.
    fn round(&self, round: Round) -> impl Future<Output = Result<RoundResult, DbError>> + Send;

    /// The token of the instance this store claims for: the owner written
    /// with its leases.
    fn owner(&self) -> LeaseOwner;
}

/// The outbox in PostgreSQL.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    clock: Arc<dyn Clock>,
    /// Retention zero: acknowledged rows are deleted, not marked.
    delete_published: bool,
    owner: LeaseOwner,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("delete_published", &self.delete_published)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// The outbox of one publisher instance, with a token of its own.
    pub fn new(pool: PgPool, clock: Arc<dyn Clock>, delete_published: bool) -> Self {
        Self {
            pool,
            clock,
            delete_published,
            owner: LeaseOwner::new(),
        }
    }
}

impl Store for PgStore {
    fn owner(&self) -> LeaseOwner {
        self.owner
    }

    async fn round(&self, round: Round) -> Result<RoundResult, DbError> {
        let mut conn = self.pool.get().await?;
        let now = self.clock.now();
        let owner = self.owner;
        conn.transaction(async |conn| {
            if !round.published.is_empty() {
                if self.delete_published {
                    outbox::delete_rows(conn, &round.published, owner).await?;
                } else {
                    outbox::mark_published(conn, &round.published, now, owner).await?;
                }
            }
            for (id, reason) in &round.parked {
                outbox::park(conn, *id, reason, now, owner).await?;
            }
            let mut lost = Vec::new();
            if !round.renew.is_empty() {
                let renewed = outbox::renew(conn, &round.renew, round.lease, owner).await?;
                if renewed.len() < round.renew.len() {
                    let renewed: std::collections::HashSet<i64> = renewed.into_iter().collect();
                    lost = round
                        .renew
                        .iter()
                        .copied()
                        .filter(|id| !renewed.contains(id))
                        .collect();
                }
            }
            if !round.release.is_empty() {
                outbox::release(conn, &round.release, owner).await?;
            }
            let mut relayout_left = Vec::new();
            for (topic, partitions) in &round.layouts {
                outbox::set_layout(conn, topic, *partitions, now).await?;
                let laid = outbox::relayout(conn, topic, *partitions, RELAYOUT_BATCH).await?;
                if laid >= RELAYOUT_BATCH as usize {
                    relayout_left.push(topic.clone());
                }
            }
            let claimed = match &round.claim {
                Some(claim) => outbox::claim(conn, claim, owner).await?,
                None => Vec::new(),
            };
            Ok(RoundResult {
                claimed,
                lost,
                relayout_left,
            })
        })
        .await
    }
}
