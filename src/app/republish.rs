//! `republish`: the events of expired bookings rebuilt from the audit
//! trail and enqueued again (or printed, `--dry-run`). One step per batch,
//! in its own transaction, returns what it did ([`BatchOutcome`]); a thin
//! loop around it keeps the report, calls back and stops between batches.

use diesel_async::{AsyncConnection as _, AsyncPgConnection};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::AppError;
use crate::{
    clock::Clock,
    config::{ConfigError, DatabaseSettings, EventSettings},
    db::{self, DbError, privileges::Use, replay},
    domain::RunId,
    events::outbox_message,
    telemetry::trace,
};

/// What `republish` is asked to do.
#[derive(Debug, Clone)]
pub struct RepublishRequest {
    pub selection: db::replay::Selection,
    /// Print the events instead of enqueuing them.
    pub dry_run: bool,
    /// Records per transaction.
    pub batch_size: u32,
    /// Resume cursor: start after this audit record id.
    pub after: i64,
    /// The replay the rows belong to (a new one when `None`).
    pub replay_id: Option<uuid::Uuid>,
}

impl RepublishRequest {
    /// The command line that resumes this request after `after` as replay
    /// `replay_id`: the selection, the batch size, `--dry-run`, the topic
    /// and `ce_source` when they are not the defaults, and the cursor. The
    /// database settings come from the environment, as for the first run.
    pub fn resume_command(
        &self,
        events: &EventSettings,
        after: i64,
        replay_id: uuid::Uuid,
    ) -> String {
        let selection = &self.selection;
        let mut words = vec!["booking-expiration".to_owned(), "republish".to_owned()];
        let mut flag = |name: &str, value: String| {
            words.push(name.to_owned());
            words.push(shell_word(&value));
        };
        for id in &selection.booking_ids {
            flag("--booking-id", id.to_string());
        }
        for id in &selection.tenant_ids {
            flag("--tenant", id.to_string());
        }
        if let Some(from) = &selection.expired_from {
            flag("--expired-from", rfc3339(from));
        }
        if let Some(to) = &selection.expired_to {
            flag("--expired-to", rfc3339(to));
        }
        flag("--batch-size", self.batch_size.to_string());
        let defaults = EventSettings::default();
        if events.topic != defaults.topic {
            flag("--kafka-topic", events.topic.clone());
        }
        if events.ce_source != defaults.ce_source {
            flag("--ce-source", events.ce_source.clone());
        }
        flag("--replay-id", replay_id.to_string());
        flag("--after", after.to_string());
        if self.dry_run {
            words.push("--dry-run".to_owned());
        }
        words.join(" ")
    }
}

/// A time as `--expired-from`/`--expired-to` take it, to the precision it has.
fn rfc3339(time: &chrono::DateTime<chrono::Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// `value` as one word for a POSIX shell: as it is when it holds only
/// characters no shell treats specially, else in single quotes.
fn shell_word(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c));
    if plain {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', "'\\''"))
    }
}

/// Progress and result of `republish`: printed on stderr after every batch
/// and on stdout at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RepublishReport {
    pub replay_id: uuid::Uuid,
    pub dry_run: bool,
    pub batches: u64,
    /// Expiry records read.
    pub selected: u64,
    /// Outbox rows written (dry run: events printed).
    pub enqueued: u64,
    /// Events with a row still waiting to be sent, or already enqueued by this replay.
    pub skipped_pending: u64,
    /// Records whose event cannot be rebuilt (logged with the reason).
    pub unrebuildable: u64,
    /// The resume cursor: the last audit record id done (`--after`).
    pub after: i64,
    /// Every selected record was done (false: stopped, resume with `after`).
    pub complete: bool,
}

/// One event as `republish --dry-run` prints it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RepublishedEvent {
    pub audit_id: i64,
    pub topic: String,
    pub key: String,
    pub event_id: uuid::Uuid,
    pub headers: crate::events::Headers,
    /// The record value (protobuf), hex.
    pub value_hex: String,
}

/// What one batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Expiry records read.
    pub selected: u64,
    /// Records whose event cannot be rebuilt (logged with the reason).
    pub unrebuildable: u64,
    /// Outbox rows written; a dry run writes none and prints `printed`.
    pub enqueued: u64,
    /// Rebuilt events not written: a row of theirs still waits to be sent,
    /// or this replay enqueued them already.
    pub skipped_pending: u64,
    /// The events a dry run prints, in audit order.
    pub printed: Vec<RepublishedEvent>,
    /// The last audit record id read (`None`: the batch was empty).
    pub last_audit_id: Option<i64>,
    /// The batch was not full: nothing is left after it.
    pub last: bool,
}

impl RepublishReport {
    /// Adds a batch to the totals and moves the cursor past it.
    fn add(&mut self, batch: &BatchOutcome) {
        self.batches += 1;
        self.selected += batch.selected;
        self.unrebuildable += batch.unrebuildable;
        self.enqueued += batch.enqueued;
        self.skipped_pending += batch.skipped_pending;
        if let Some(last) = batch.last_audit_id {
            self.after = last;
        }
        self.complete = batch.last;
    }
}

/// Checks a request before anything connects: it must name what to
/// replay, and a window must not be empty.
fn check(request: &RepublishRequest) -> Result<(), ConfigError> {
    if !request.selection.is_restricted() {
        return Err(ConfigError::new(
            "republish",
            "name what to replay: --booking-id, --tenant, --expired-from or --expired-to",
        ));
    }
    if let (Some(from), Some(to)) = (request.selection.expired_from, request.selection.expired_to)
        && request.selection.window_is_empty()
    {
        return Err(ConfigError::new(
            "--expired-from",
            format!(
                "{} is not before --expired-to {} (the window is [from, to): it would select nothing)",
                rfc3339(&from),
                rfc3339(&to)
            ),
        ));
    }
    Ok(())
}

/// One replay in progress: the connection, where the window lies in the
/// audit trail, and what it was asked.
struct Replay<'a> {
    conn: AsyncPgConnection,
    bounds: replay::IdBounds,
    request: &'a RepublishRequest,
    events: &'a EventSettings,
    clock: &'a dyn Clock,
    replay_id: uuid::Uuid,
    span: tracing::Span,
}

impl Replay<'_> {
    /// One batch after audit record `after`, in one transaction.
    async fn step(&mut self, after: i64) -> Result<BatchOutcome, DbError> {
        let span = tracing::info_span!(
            parent: &self.span,
            "republish_batch",
            replay_id = %self.replay_id,
            after,
            selected = tracing::field::Empty,
            tenant_count = tracing::field::Empty,
        );
        // Replay rows carry the replay's trace context, not the cycle's.
        let trace_headers = trace::headers_of(&span);
        let (request, events, clock, replay_id) =
            (self.request, self.events, self.clock, self.replay_id);
        let (bounds, selection) = (&self.bounds, &request.selection);
        let (rows, writes, enqueued) = self
            .conn
            .transaction(async |conn| {
                let rows = replay::page(conn, selection, bounds, after, request.batch_size).await?;
                let mut writes = Vec::with_capacity(rows.len());
                for row in &rows {
                    let rebuilt = row
                        .to_domain()
                        .and_then(|record| record.rebuild().map_err(|e| e.to_string()));
                    match rebuilt {
                        Ok(event) => writes.push((
                            row.audit_id,
                            replay::ReplayWrite {
                                message: outbox_message(
                                    &event,
                                    RunId::new(row.correlation_id),
                                    row.ce_source.as_deref().unwrap_or(&events.ce_source),
                                    &trace_headers,
                                ),
                                correlation_id: row.correlation_id,
                            },
                        )),
                        Err(reason) => tracing::error!(
                            audit_id = row.audit_id,
                            booking_id = %row.booking_id,
                            %reason,
                            "cannot rebuild the event of this expiry; skipped"
                        ),
                    }
                }
                if request.dry_run {
                    return Ok::<_, DbError>((rows, writes, None));
                }
                let to_send: Vec<replay::ReplayWrite> =
                    writes.iter().map(|(_, w)| w.clone()).collect();
                let enqueued =
                    replay::enqueue(conn, &events.topic, clock.now(), replay_id, &to_send).await?;
                Ok((rows, writes, Some(enqueued.len() as u64)))
            })
            .instrument(span.clone())
            .await?;
        let tenants: std::collections::HashSet<uuid::Uuid> =
            rows.iter().map(|r| r.tenant_id).collect();
        span.record("selected", rows.len());
        span.record("tenant_count", tenants.len());
        let mut outcome = BatchOutcome {
            selected: rows.len() as u64,
            unrebuildable: (rows.len() - writes.len()) as u64,
            last_audit_id: rows.last().map(|row| row.audit_id),
            last: rows.len() < request.batch_size as usize,
            ..BatchOutcome::default()
        };
        match enqueued {
            Some(enqueued) => {
                outcome.enqueued = enqueued;
                outcome.skipped_pending = writes.len() as u64 - enqueued;
            }
            None => {
                outcome.enqueued = writes.len() as u64;
                outcome.printed = writes
                    .iter()
                    .map(|(audit_id, write)| RepublishedEvent {
                        audit_id: *audit_id,
                        topic: events.topic.clone(),
                        key: write.message.key.clone(),
                        event_id: write.message.event_id,
                        headers: write.message.headers.clone(),
                        value_hex: write
                            .message
                            .payload
                            .iter()
                            .map(|b| format!("{b:02x}"))
                            .collect(),
                    })
                    .collect();
            }
        }
        Ok(outcome)
    }
}

/// `republish`: re-enqueues the events of expired bookings, rebuilt from
/// the audit trail and the bookings with the cycle's own builder, one
/// transaction per batch; reads bookings only. Stops between batches on
/// `shutdown` (`complete: false`). A dry run hands each event to
/// `on_event`; `on_batch` gets the report after every batch.
pub async fn republish(
    database: &DatabaseSettings,
    events: &EventSettings,
    request: &RepublishRequest,
    clock: &dyn Clock,
    shutdown: CancellationToken,
    mut on_event: impl FnMut(&RepublishedEvent),
    mut on_batch: impl FnMut(&RepublishReport),
) -> Result<RepublishReport, AppError> {
    check(request)?;
    super::announce_database(database);
    let mut conn = db::establish(database).await?;
    db::privileges::check(&mut conn, &[Use::Republish]).await?;
    let mut report = RepublishReport {
        replay_id: request.replay_id.unwrap_or_else(uuid::Uuid::new_v4),
        dry_run: request.dry_run,
        after: request.after,
        ..RepublishReport::default()
    };
    // Where the window lies in the audit trail, read once: each page then
    // reads about what it returns (see `db::replay`).
    let selection = &request.selection;
    let Some(bounds) = conn
        .transaction(async |conn| replay::id_bounds(conn, selection).await)
        .await?
    else {
        report.complete = true;
        tracing::info!(replay_id = %report.replay_id, "republish: no expiry in the window");
        return Ok(report);
    };
    let mut replay = Replay {
        conn,
        bounds,
        request,
        events,
        clock,
        replay_id: report.replay_id,
        span: tracing::info_span!("republish", replay_id = %report.replay_id, dry_run = request.dry_run),
    };
    while !shutdown.is_cancelled() {
        let batch = replay.step(report.after).await?;
        batch.printed.iter().for_each(&mut on_event);
        report.add(&batch);
        on_batch(&report);
        if batch.last {
            break;
        }
    }
    tracing::info!(
        replay_id = %report.replay_id,
        enqueued = report.enqueued,
        complete = report.complete,
        "republish finished"
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> RepublishRequest {
        RepublishRequest {
            selection: db::replay::Selection {
                booking_ids: vec![uuid::Uuid::from_u128(1)],
                tenant_ids: vec![uuid::Uuid::from_u128(2), uuid::Uuid::from_u128(3)],
                expired_from: chrono::DateTime::parse_from_rfc3339("2026-12-01T00:00:00Z")
                    .ok()
                    .map(|t| t.to_utc()),
                expired_to: chrono::DateTime::parse_from_rfc3339("2026-12-02T06:30:00.250Z")
                    .ok()
                    .map(|t| t.to_utc()),
            },
            dry_run: false,
            batch_size: 100,
            after: 0,
            replay_id: None,
        }
    }

    #[test]
    fn the_resume_command_carries_the_whole_selection_and_the_cursor() {
        let replay_id = uuid::Uuid::from_u128(9);
        let command = request().resume_command(&EventSettings::default(), 4711, replay_id);
        assert_eq!(
            command,
            "booking-expiration republish \
             --booking-id 00000000-0000-0000-0000-000000000001 \
             --tenant 00000000-0000-0000-0000-000000000002 \
             --tenant 00000000-0000-0000-0000-000000000003 \
             --expired-from 2026-12-01T00:00:00Z --expired-to 2026-12-02T06:30:00.250Z \
             --batch-size 100 --replay-id 00000000-0000-0000-0000-000000000009 --after 4711"
        );
    }

    #[test]
    fn the_resume_command_keeps_a_dry_run_and_settings_off_their_defaults() {
        let events = EventSettings {
            topic: "crm.replays".into(),
            ce_source: "/pin/crm/it's here".into(),
        };
        let request = RepublishRequest {
            dry_run: true,
            ..request()
        };
        let command = request.resume_command(&events, 1, uuid::Uuid::nil());
        assert!(command.contains(" --kafka-topic crm.replays "), "{command}");
        assert!(
            command.contains(r#" --ce-source '/pin/crm/it'\''s here' "#),
            "{command}"
        );
        assert!(command.ends_with(" --after 1 --dry-run"), "{command}");
    }
}
