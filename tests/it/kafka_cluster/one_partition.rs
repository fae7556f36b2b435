//! What the two scenarios of one partition (`unwritable`, `slow`) share:
//! their flow on [`p0_alone_layout`], its end (the topic checked, the
//! figures of both clients, the gaps of what was written, claimed and
//! marked), the watcher's timeline of partition 0 and the copies goal.

use super::*;

/// A flow on [`p0_alone_layout`] with bookings falling due for `spread`,
/// once its first 2,000 rows are published.
pub(super) async fn start(cluster: &Cluster, files: &Path, spread: Duration) -> Flow {
    let flow = Flow::start(cluster, files, &p0_alone_layout(), spread).await;
    flow.wait_published(2_000, Duration::from_secs(60)).await;
    flow
}

/// What a finished scenario of one partition leaves to report.
pub(super) struct Ended {
    pub(super) fin: Finished,
    pub(super) checked: Checked,
    /// The worker's figures and the Java producer's over the step.
    pub(super) worker: Figures,
    pub(super) java: Figures,
}

/// Finishes `flow`, checks its topic and measures the step `window` under
/// `faults`; reports the gaps of what was written, claimed and marked.
pub(super) async fn end(
    flow: Flow,
    cluster: &Cluster,
    faults: &Faults,
    window: (i64, i64),
    report: &mut Report,
    name: &str,
) -> Ended {
    let due = flow.due;
    let fin = flow.finish().await;
    let checked = check_topic(cluster, &fin.topic, 3, due, |_| vec![3]);
    let published = Flow::published_of(&fin.db).await;
    let (worker, java) = both(&fin, &checked.appended, faults, window);
    written_line(report, name, &fin, &published, &checked, window);
    Ended {
        fin,
        checked,
        worker,
        java,
    }
}

/// The goal of both scenarios: no event written more than [`MOST_COPIES`]
/// times.
pub(super) fn copies_goal(report: &mut Report, name: &str, checked: &Checked) {
    report.goal(
        name,
        checked.most_copies <= MOST_COPIES,
        format!(
            "no event written more than {MOST_COPIES} times: {}",
            checked.summary()
        ),
    );
}

/// The watcher's view of `partition` of `topic` within `[from, to]`, for
/// the figures: "+12.3 s leader 1 isr 1,2; …" relative to `from`.
pub(super) fn render_timeline(
    timelines: &Timelines,
    topic: &str,
    partition: i32,
    from: i64,
    to: i64,
) -> String {
    let Some(timeline) = timelines.get(&(topic.to_owned(), partition)) else {
        return "not watched".into();
    };
    let mut shown: Vec<String> = Vec::new();
    for o in timeline {
        if o.at_ms > to {
            break;
        }
        let isr: Vec<String> = o.isr.iter().map(i32::to_string).collect();
        let state = format!("leader {} isr {}", o.leader, isr.join(","));
        if o.at_ms <= from {
            shown = vec![format!("before: {state}")];
        } else {
            shown.push(format!("+{} {state}", secs(ms(o.at_ms - from))));
        }
    }
    shown.join("; ")
}

/// Prints, for the step `window`, the longest gaps per partition in what
/// the expiry wrote (`created_at`: a publishing gap with no writing gap
/// under it is the publisher's) and in what the outbox marked published
/// (`published_at`: the database round after the acknowledgement, so
/// later than the broker's append by as long as the round in flight took).
pub(super) fn written_line(
    report: &mut Report,
    name: &str,
    fin: &Finished,
    published: &[Published],
    checked: &Checked,
    window: (i64, i64),
) {
    let no_faults = Faults::default();
    let written = written_by_partition(published, &checked.partition_of);
    let written = measure(&written, &fin.timelines, &fin.topic, &no_faults, window);
    let marked = acks_by_partition(published, &checked.partition_of);
    let marked = measure(&marked, &fin.timelines, &fin.topic, &no_faults, window);
    let claimed = by_partition(published, &checked.partition_of, |p| p.claimed_at);
    let claimed = measure(&claimed, &fin.timelines, &fin.topic, &no_faults, window);
    report.line(format!(
        "{name}: longest gaps per partition in the rows the expiry wrote: {}; \
         in the rows claimed (last lease taken): {}; in the rows marked published: {}",
        render_gaps(&written),
        render_gaps(&claimed),
        render_gaps(&marked)
    ));
}
