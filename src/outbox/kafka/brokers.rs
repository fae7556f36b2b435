//! The worker's produce connections, per broker, and each broker's
//! throttle hold.
//!
//! A connection carries one request at a time. A broker handles the
//! requests of one connection one after another, answering each before it
//! reads the next, so a request sent behind another partition's shares its
//! fate: behind a request that waits for a frozen follower's
//! acknowledgement, a healthy partition's request waits as long (measured
//! on a real cluster with one connection per broker shared by every
//! partition: 25.8 s, as the Java producer, whose one request per broker
//! carries every partition it leads). So each request takes an idle
//! connection to its leader, or opens one when none is idle, and gives it
//! back when answered: partitions whose requests do not overlap share one
//! connection per broker, and a broker never has more connections than
//! requests on the way to it at once (at most one per partition it leads,
//! as the pipeline has at most one request on the way per partition). A
//! connection that broke, or whose request was cut short (a timeout, a
//! dropped call), is closed instead of given back.
//!
//! Throttling (KIP-219): a broker past a client quota still appends and
//! acknowledges the request, and says in `throttle_time_ms` how long the
//! client must wait before its next request (the broker mutes the
//! connection meanwhile). The acknowledgement stands: its records are
//! marked, never sent again. The next request to that broker waits out the
//! hold first. Each throttled answer is counted; the log says it once a
//! minute per broker at most, with the time held.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use super::{
    KafkaError,
    connection::{Connection, Endpoint},
};
use crate::config::KafkaSettings;

/// How often a throttled broker is mentioned in the log at most.
const THROTTLE_REPORT_EVERY: Duration = Duration::from_secs(60);

/// Throttling counters (the process's
/// `crm_booking_expiration_kafka_throttled_responses_total` and
/// `…_kafka_throttle_seconds_total`).
#[derive(Debug, Clone, Default)]
pub struct ThrottleMetrics {
    /// Answers that asked for a hold.
    pub responses: Counter,
    /// The holds asked for, in seconds.
    pub seconds: Counter<f64, std::sync::atomic::AtomicU64>,
}

/// A plain-data lock: a panic elsewhere leaves it usable.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One connection that is opened once and shared: the metadata
/// connection.
#[derive(Default)]
pub(super) struct Shared {
    current: Mutex<Option<Arc<Connection>>>,
    /// Held while a connection is being opened: callers that need one
    /// meanwhile wait for that one instead of opening their own.
    opening: tokio::sync::Mutex<()>,
}

impl Shared {
    /// The open connection, if any (one the broker closed is forgotten).
    pub(super) fn current(&self) -> Option<Arc<Connection>> {
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|open| open.is_closed()) {
            *current = None;
        }
        current.clone()
    }

    /// The open connection, or a new one to `endpoint` opened now, by
    /// `deadline`.
    pub(super) async fn get(
        &self,
        endpoint: &Endpoint,
        settings: &KafkaSettings,
        deadline: Instant,
    ) -> Result<Arc<Connection>, KafkaError> {
        if let Some(open) = self.current() {
            return Ok(open);
        }
        let _opening = tokio::time::timeout_at(deadline, self.opening.lock())
            .await
            .map_err(|_| KafkaError::Timeout {
                operation: format!("connect to broker {endpoint}"),
                timeout: settings.request_timeout,
            })?;
        if let Some(open) = self.current() {
            return Ok(open);
        }
        let opened = Arc::new(Connection::open(endpoint, settings, deadline).await?);
        tracing::debug!(broker = %endpoint, "Kafka connection opened");
        *lock(&self.current) = Some(Arc::clone(&opened));
        Ok(opened)
    }

    /// Gives up `failed` (if it is still the current one): the next
    /// request opens a new connection.
    pub(super) fn forget(&self, failed: &Arc<Connection>) {
        let mut current = lock(&self.current);
        if current
            .as_ref()
            .is_some_and(|open| Arc::ptr_eq(open, failed))
        {
            *current = None;
        }
    }
}

/// A broker's produce connections not carrying a request now.
#[derive(Default)]
pub(super) struct Pool {
    idle: Mutex<Vec<Arc<Connection>>>,
    /// Open connections: idle, or carrying a request.
    open: std::sync::atomic::AtomicUsize,
}

/// A produce connection taken from its broker's pool: given back with
/// [`Lease::give_back`] once its request was answered, closed if dropped
/// otherwise (the request was cut short, or the connection broke).
pub(super) struct Lease<'a> {
    pool: &'a Pool,
    connection: Option<Arc<Connection>>,
}

impl Lease<'_> {
    pub(super) fn connection(&self) -> &Connection {
        // Present until given back or dropped.
        self.connection
            .as_deref()
            .unwrap_or_else(|| unreachable!("a lease holds its connection"))
    }

    /// The request was answered: the connection is idle again.
    pub(super) fn give_back(mut self) {
        if let Some(connection) = self.connection.take() {
            lock(&self.pool.idle).push(connection);
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if self.connection.take().is_some() {
            self.pool
                .open
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Pool {
    /// An idle connection, or a new one to `endpoint` opened by `deadline`.
    pub(super) async fn take(
        &self,
        endpoint: &Endpoint,
        settings: &KafkaSettings,
        deadline: Instant,
    ) -> Result<Lease<'_>, KafkaError> {
        let idle = loop {
            let Some(idle) = lock(&self.idle).pop() else {
                break None;
            };
            // The broker closed it while idle: it is not used again.
            if !idle.is_closed() {
                break Some(idle);
            }
            self.open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        };
        let connection = match idle {
            Some(idle) => idle,
            None => {
                let opened = Arc::new(Connection::open(endpoint, settings, deadline).await?);
                let open = 1 + self.open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(broker = %endpoint, open, "Kafka connection opened");
                opened
            }
        };
        Ok(Lease {
            pool: self,
            connection: Some(connection),
        })
    }

    /// Open connections (idle or carrying a request), less the idle ones
    /// the broker closed meanwhile.
    pub(super) fn open(&self) -> usize {
        let closed = lock(&self.idle).iter().filter(|c| c.is_closed()).count();
        self.open
            .load(std::sync::atomic::Ordering::Relaxed)
            .saturating_sub(closed)
    }
}

/// A broker this worker produces to.
pub(super) struct Broker {
    pub endpoint: Endpoint,
    pub connections: Pool,
    throttle: Mutex<Throttle>,
}

#[derive(Default)]
struct Throttle {
    /// No request to the broker before this.
    until: Option<Instant>,
    /// When the log last said so, and what came since.
    reported_at: Option<Instant>,
    since_report: (u64, Duration),
}

impl Broker {
    fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            connections: Pool::default(),
            throttle: Mutex::new(Throttle::default()),
        }
    }

    /// Waits out the broker's throttle hold, if one is on; returns how
    /// long it waited.
    pub(super) async fn hold(&self) -> Duration {
        let until = lock(&self.throttle).until;
        let started = Instant::now();
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
        started.elapsed()
    }

    /// The broker asked for `hold` before the next request, in an answer
    /// received at `now`.
    pub(super) fn throttled(&self, hold: Duration, now: Instant, metrics: &ThrottleMetrics) {
        metrics.responses.inc();
        metrics.seconds.inc_by(hold.as_secs_f64());
        let mut throttle = lock(&self.throttle);
        let until = now + hold;
        throttle.until = Some(throttle.until.map_or(until, |held| held.max(until)));
        throttle.since_report.0 += 1;
        throttle.since_report.1 += hold;
        if throttle
            .reported_at
            .is_none_or(|at| now >= at + THROTTLE_REPORT_EVERY)
        {
            let (answers, held) = std::mem::take(&mut throttle.since_report);
            throttle.reported_at = Some(now);
            tracing::warn!(
                broker = %self.endpoint,
                hold_ms = hold.as_millis() as u64,
                throttled_answers = answers,
                held_ms = held.as_millis() as u64,
                "Kafka broker throttles this client (a quota): acknowledged records stand, the next requests to it wait as asked (said at most once a minute; crm_booking_expiration_kafka_throttle_seconds_total counts every hold)"
            );
        }
    }
}

/// The produce connections, by broker address.
#[derive(Default)]
pub(super) struct Brokers {
    by_endpoint: Mutex<HashMap<Endpoint, Arc<Broker>>>,
}

impl Brokers {
    /// The broker at `endpoint` (known from now on).
    pub(super) fn get(&self, endpoint: &Endpoint) -> Arc<Broker> {
        Arc::clone(
            lock(&self.by_endpoint)
                .entry(endpoint.clone())
                .or_insert_with(|| Arc::new(Broker::new(endpoint.clone()))),
        )
    }

    /// Open produce connections, per broker address.
    pub(super) fn open(&self) -> Vec<(String, usize)> {
        let mut open: Vec<(String, usize)> = lock(&self.by_endpoint)
            .values()
            .map(|broker| (broker.endpoint.to_string(), broker.connections.open()))
            .filter(|(_, n)| *n > 0)
            .collect();
        open.sort();
        open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_throttled_broker_holds_the_next_request_and_says_so_once_a_minute() {
        let broker = Broker::new(Endpoint {
            host: "b".into(),
            port: 9092,
        });
        let metrics = ThrottleMetrics::default();
        let start = Instant::now();
        broker.throttled(Duration::from_millis(700), start, &metrics);
        broker.throttled(Duration::from_millis(300), start, &metrics);
        broker.hold().await;
        // The longer of the two holds, not their sum.
        assert_eq!(start.elapsed(), Duration::from_millis(700));
        assert_eq!(metrics.responses.get(), 2);
        assert!((metrics.seconds.get() - 1.0).abs() < 1e-9);
        let throttle = lock(&broker.throttle);
        assert_eq!(throttle.reported_at, Some(start));
        assert_eq!(throttle.since_report, (1, Duration::from_millis(300)));
    }
}
