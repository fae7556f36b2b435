//! Which instance wakes at each deadline: the waker. One instance at a
//! time holds a lease on it (`db::waker`, one row, the database's clock)
//! and renews it every [`RENEW_EVERY`]; every other instance tries to take
//! it as often, and takes it once it ran out. The waker wakes at each
//! deadline and probes for new ones; the others keep the interval tick, and
//! cycle every minimum gap too while the waker says it has due rows left.
//! So N instances run the statements of one for the same bookings, and a
//! waker that stops, crashes or freezes is replaced within
//! [`LEASE`] + [`RENEW_EVERY`] (under a second). The rows themselves stay
//! divided by `SKIP LOCKED`: two wakers for a moment (one thawing from a
//! freeze) expire each row once all the same.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use diesel_async::AsyncConnection;
use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{
    db::{self, PgPool},
    telemetry::{ErrorChain, Metrics},
};

/// How long a lease lasts: three renewals fit in it, so one slow
/// statement does not cost the lease.
pub const LEASE: Duration = Duration::from_millis(600);

/// How often the waker renews its lease, and the others look at it. With
/// [`LEASE`], a waker that stops is replaced within 0.8 s.
pub const RENEW_EVERY: Duration = Duration::from_millis(200);

/// This instance's view of the lease, shared by the scheduler and the
/// task that keeps the lease.
#[derive(Debug, Default)]
pub struct Waker {
    mine: AtomicBool,
    helping: AtomicBool,
    /// This instance's last cycle left due rows (said with the lease).
    backlog: AtomicBool,
    /// This instance just became the waker (the scheduler probes at once).
    became: AtomicBool,
    changed: Notify,
}

impl Waker {
    /// Whether this instance is the waker now.
    pub fn is_waker(&self) -> bool {
        self.mine.load(Ordering::Relaxed)
    }

    /// Whether the waker (another instance) has due rows left.
    pub fn helping(&self) -> bool {
        self.helping.load(Ordering::Relaxed)
    }

    /// Whether this instance became the waker since the last call.
    pub fn take_became_waker(&self) -> bool {
        self.became.swap(false, Ordering::Relaxed)
    }

    /// This instance's last cycle left due rows, or none.
    pub fn set_backlog(&self, backlog: bool) {
        self.backlog.store(backlog, Ordering::Relaxed);
    }

    /// Resolves when this instance became or stopped being the waker, or
    /// the waker started or stopped needing help.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    fn set(&self, mine: bool, helping: bool) {
        let was_mine = self.mine.swap(mine, Ordering::Relaxed);
        let was_helping = self.helping.swap(helping, Ordering::Relaxed);
        if mine && !was_mine {
            self.became.store(true, Ordering::Relaxed);
        }
        if was_mine != mine || was_helping != helping {
            self.changed.notify_one();
        }
    }
}

/// Keeps this instance's part of the lease until `shutdown`, then gives
/// it up if it holds it (another instance takes it at once).
pub async fn keep_lease(
    pool: PgPool,
    waker: Arc<Waker>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let me = Uuid::new_v4();
    // Until when this instance may count itself the waker without a renewal
    // (the lease as the database last granted it, on this clock).
    let mut held_until: Option<Instant> = None;
    let mut failing = false;
    loop {
        let started = Instant::now();
        let backlog = waker.backlog.load(Ordering::Relaxed);
        let look = tokio::time::timeout(LEASE, async {
            let mut conn = pool.get().await?;
            // Every unit of work is a transaction (see `db`): through a
            // transaction pooler, a statement outside one is prepared on one
            // server connection and run on another.
            conn.transaction(async |conn| db::waker::hold(conn, me, LEASE, backlog).await)
                .await
        })
        .await;
        match look {
            Ok(Ok(lease)) => {
                if std::mem::take(&mut failing) {
                    tracing::info!("the deadline waker's lease is read again");
                }
                held_until = lease.mine.then_some(started + LEASE);
                if lease.mine != waker.is_waker() {
                    tracing::info!(
                        waker = lease.mine,
                        "{}",
                        if lease.mine {
                            "this instance wakes at each deadline now"
                        } else {
                            "another instance wakes at each deadline now; this one keeps the tick"
                        }
                    );
                }
                waker.set(lease.mine, lease.busy);
            }
            failed => {
                if !std::mem::replace(&mut failing, true) {
                    let error = match failed {
                        Ok(Err(error)) => ErrorChain(&error).to_string(),
                        _ => format!("no answer within {LEASE:?}"),
                    };
                    tracing::warn!(%error, "the deadline waker's lease not read; trying again");
                }
                // Past the lease it last got, another instance may hold it.
                if held_until.is_none_or(|until| Instant::now() >= until) {
                    held_until = None;
                    waker.set(false, false);
                }
            }
        }
        metrics.expiry_waker.set(i64::from(waker.is_waker()));
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep_until(started + RENEW_EVERY) => {}
        }
    }
    if waker.is_waker() {
        waker.set(false, false);
        let given = async {
            let mut conn = pool.get().await?;
            conn.transaction(async |conn| db::waker::give_up(conn, me).await)
                .await
        };
        if let Ok(Err(error)) = tokio::time::timeout(LEASE, given).await {
            tracing::warn!(error = %ErrorChain(&error), "the deadline waker's lease not given up; it runs out by itself");
        }
    }
    metrics.expiry_waker.set(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_outlives_two_missed_renewals_and_a_stop_is_seen_within_a_second() {
        assert!(LEASE > RENEW_EVERY * 2);
        assert!(LEASE + RENEW_EVERY < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn becoming_the_waker_is_said_once_and_wakes_the_scheduler() {
        let waker = Waker::default();
        waker.set(true, false);
        tokio::time::timeout(Duration::from_secs(1), waker.changed())
            .await
            .expect("notified");
        assert!(waker.is_waker());
        assert!(waker.take_became_waker());
        assert!(!waker.take_became_waker(), "once");
        waker.set(true, false);
        assert!(!waker.take_became_waker(), "still the waker: nothing new");
        waker.set(false, true);
        assert!(!waker.is_waker() && waker.helping());
    }
}
