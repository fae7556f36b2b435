//! The pipeline's Kafka side: a request for each partition that can take
//! one, what its answer does to the partition's queue and the marks, a
//! topic's metadata, and failures reported once a minute.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Answer, Run};
use crate::outbox::{
    queues::Send,
    report::Line,
    store::Store,
    transport::{ErrorClass, LAYOUT_CHANGED, SendError, Transport},
};

impl<T: Transport, S: Store> Run<'_, T, S> {
    /// Starts a request for every partition that can take one now.
    pub(super) fn start_sends(&mut self, now: Instant) {
        for Send {
            request,
            topic,
            partition,
            partitions,
            records,
        } in self.queues.ready(now)
        {
            let transport = Arc::clone(&self.parts.transport);
            // The transport bounds its own calls (`Transport`'s contract):
            // it knows what a timeout leaves to clean up.
            self.answers.spawn(async move {
                let started = Instant::now();
                let result = transport
                    .produce(&topic, partition, partitions, records)
                    .await;
                (topic, partition, request, started.elapsed(), result)
            });
        }
    }

    /// Starts reading a topic's partition count when one is due.
    pub(super) fn start_metadata(&mut self, now: Instant) {
        if self.metadata.is_some() {
            return;
        }
        let Some(topic) = self.queues.metadata_due(now) else {
            return;
        };
        let transport = Arc::clone(&self.parts.transport);
        let reason = if self.queues.topic_known(&topic) {
            "periodic"
        } else {
            "connect"
        };
        self.parts
            .metrics
            .kafka_metadata_refreshes
            .get_or_create(&crate::telemetry::metrics::ReasonLabel { reason })
            .inc();
        self.metadata = Some(tokio::spawn(async move {
            let result = transport.partitions(&topic).await;
            (topic, result)
        }));
    }

    pub(super) fn answered(
        &mut self,
        (topic, partition, request, took, result): Answer,
        now: Instant,
    ) {
        let metrics = &self.parts.metrics;
        metrics
            .outbox_produce_duration_seconds
            .observe(took.as_secs_f64());
        let completed = self
            .queues
            .complete(&topic, partition, request, &result, now);
        let subject = format!("{topic}/{partition}");
        if !completed.acked.is_empty() {
            let acked_at = self.parts.clock.now();
            for row in &completed.acked {
                let lag = (acked_at - row.created_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
                metrics.outbox_commit_to_ack_seconds.observe(lag.max(0.0));
            }
            metrics
                .outbox_published
                .inc_by(completed.acked.len() as u64);
            self.done.published += completed.acked.len() as u64;
            self.published
                .extend(completed.acked.iter().map(|row| row.id));
        }
        if let Some(failing) = completed.recovered {
            self.reports.recovered(&subject);
            tracing::info!(topic, partition, after_ms = (now - failing.since).as_millis() as u64, code = %failing.code, "partition publishes again");
        }
        if let Some((row, reason)) = completed.parked {
            tracing::warn!(topic, partition, reason = %reason, "record refused by the broker for good; its outbox row is parked (see `status`, then `outbox retry`)");
            self.parked.push((row.id, reason));
        }
        if let Err(error) = &result {
            if error.code == LAYOUT_CHANGED {
                self.queues.read_again(&topic);
            }
            metrics.produce_error(&error.code);
            metrics.outbox_publish_errors.inc();
            if error.class != ErrorClass::Refused {
                self.report(&subject, &topic, Some(partition), error, now);
            }
        }
        // Its rows left the queue: a partition the last claim left out may
        // take more.
        if self
            .skipped
            .full
            .iter()
            .any(|(t, p)| *t == topic && *p == partition)
        {
            self.more = true;
        }
    }

    pub(super) fn metadata_done(
        &mut self,
        topic: &str,
        result: Result<i32, SendError>,
        now: Instant,
    ) {
        match result {
            Ok(count) => {
                if topic == self.parts.topic {
                    self.parts.health.set_broker_reachable(true);
                }
                if self.reports.recovered(topic) {
                    tracing::info!(topic, partitions = count, "topic readable again");
                }
                if let Some((before, after)) = self.queues.set_partitions(topic, count, now) {
                    // Writers give new rows their partition in this layout.
                    self.layouts.push((topic.to_owned(), count));
                    if before > 0 {
                        tracing::warn!(
                            topic,
                            before,
                            after,
                            "partition count changed; keys map to the new partitions from now on"
                        );
                    }
                }
                if self.skipped.skip_topics.iter().any(|t| t == topic) {
                    self.more = true;
                }
            }
            Err(error) => {
                // A broker that answered (a missing topic, a refused
                // authorization) is reachable: that failure is the topic's,
                // counted with the failing partitions.
                if topic == self.parts.topic {
                    self.parts
                        .health
                        .set_broker_reachable(error.class != ErrorClass::Retriable);
                }
                self.parts.metrics.produce_error(&error.code);
                self.queues.metadata_failed(topic, &error, now);
                self.report(topic, topic, None, &error, now);
            }
        }
    }

    /// Logs a failure of `subject` when one is due (see `report`).
    fn report(
        &mut self,
        subject: &str,
        topic: &str,
        partition: Option<i32>,
        error: &SendError,
        now: Instant,
    ) {
        let Some(line) = self.reports.failed(subject, now) else {
            return;
        };
        let failed = match line {
            Line::First => 1,
            Line::Still { failed } => failed,
        };
        let what = if partition.is_some() {
            "partition cannot be written"
        } else {
            "topic cannot be read"
        };
        match error.class {
            ErrorClass::Fatal => {
                tracing::error!(topic, partition, code = %error.code, failed, error = %error.message, "{what} until an operator acts (its rows wait in the outbox; tried again every {:?})", self.parts.timing.fatal_pause)
            }
            _ => {
                tracing::warn!(topic, partition, code = %error.code, failed, error = %error.message, "{what}; its rows wait and it is tried again (the other partitions go on)")
            }
        }
    }
}
