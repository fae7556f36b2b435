//! Wakes the publisher when outbox rows commit: a dedicated connection
//! LISTENs on the channel the outbox trigger notifies. If it breaks, the
//! publisher still polls, and the listener reconnects with backoff.

use std::{sync::Arc, time::Duration};

use diesel_async::RunQueryDsl;
use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{
    backoff::Backoff,
    config::DatabaseSettings,
    db::{self, outbox::CHANNEL},
    telemetry::ErrorChain,
};
/// How often the idle LISTEN connection is checked.
const PING_INTERVAL: Duration = Duration::from_secs(15);

/// Why the LISTEN connection was lost.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error(transparent)]
    Database(#[from] db::DbError),
    /// The server closed the connection's notification stream.
    #[error("the LISTEN connection's notification stream ended")]
    StreamEnded,
}

impl From<diesel::result::Error> for ListenError {
    fn from(error: diesel::result::Error) -> Self {
        ListenError::Database(error.into())
    }
}

/// Runs until `shutdown`, calling `wake.notify_one()` per notification.
pub async fn listen_for_commits(
    settings: DatabaseSettings,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    while !shutdown.is_cancelled() {
        match listen_once(&settings, &wake, &shutdown).await {
            Ok(()) => return,
            Err(error) => {
                tracing::warn!(error = %ErrorChain(&error), "outbox LISTEN connection lost; polling until it is back");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }
}

async fn listen_once(
    settings: &DatabaseSettings,
    wake: &Notify,
    shutdown: &CancellationToken,
) -> Result<(), ListenError> {
    let mut conn = db::establish(settings).await?;
    diesel::sql_query(format!("LISTEN {CHANNEL}"))
        .execute(&mut conn)
        .await?;
    // Rows committed while nobody listened are found by this first wake-up.
    wake.notify_one();
    loop {
        {
            let mut notifications = std::pin::pin!(conn.notifications_stream());
            let ping_at = tokio::time::sleep(PING_INTERVAL);
            tokio::pin!(ping_at);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = &mut ping_at => break,
                    notification = notifications.next() => match notification {
                        Some(Ok(_)) => wake.notify_one(),
                        Some(Err(error)) => return Err(error.into()),
                        None => return Err(ListenError::StreamEnded),
                    },
                }
            }
        }
        diesel::sql_query("SELECT 1").execute(&mut conn).await?;
    }
}
