//! `unwritable`: one partition refuses writes for 60 s (its only follower
//! stopped), the others stay writable.

use super::*;

/// The first scenario, on the defaults cluster: on a topic with
/// replication factor 2 and `min.insync.replicas=2` ([`p0_alone_layout`]),
/// partition 0's only follower stopped with SIGTERM for
/// [`UNWRITABLE_FOR`], then started again: partition 0 refuses writes
/// (NOT_ENOUGH_REPLICAS) while partitions 1 and 2 stay writable.
/// Invariant: every booking on the topic, duplicates with the same `ce_id`
/// and bytes. Goals: partitions 1 and 2 never stall 1 s; no event written
/// more than twice; the worker's resident memory flat (the last sample of
/// the outage at most [`RSS_BOUND_KIB`] above the first after
/// [`RSS_WARM_UP`]); partition 0 publishes again < 1 s after it is
/// writable.
pub(super) async fn one_partition_unwritable(cluster: &Cluster, files: &Path, report: &mut Report) {
    const NAME: &str = "one partition unwritable";
    // Bookings keep falling due until after node 2 rejoined.
    let flow = one_partition::start(cluster, files, UNWRITABLE_FOR + Duration::from_secs(40)).await;
    let due = flow.due;
    let pid = flow.running.child.id();
    let quiet_from = now_ms();
    let (pg_quiet, worker_quiet) = (pg_cpu_ticks(&flow.db).await, cpu_ticks(pid));
    // Deliberate fault timing: some publishing without a fault, to compare.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut faults = Faults::default();
    let from = now_ms();
    let (pg_from, worker_from) = (pg_cpu_ticks(&flow.db).await, cpu_ticks(pid));
    let claim_before = claim_cost(&flow.db, &flow.topic).await;
    let rss_before = rss_kib(pid).unwrap_or_default();
    let t = Instant::now();
    blocking(|| cluster.stop_node(P0_FOLLOWER));
    let stop_took = t.elapsed();
    let stopped = now_ms();
    faults.down(P0_FOLLOWER, stopped);
    progress(&format!(
        "node {P0_FOLLOWER} (partition 0's only follower) stopped in {}",
        secs(stop_took)
    ));
    let rss = RssSampler::start(pid);
    let published_at_stop = flow.published_count().await;
    let (pg_stopped, worker_stopped) = (pg_cpu_ticks(&flow.db).await, cpu_ticks(pid));
    // The scenario's definition: unwritable this long.
    sleep_until_ms(stopped + UNWRITABLE_FOR.as_millis() as i64 - 2_000).await;
    let claim_late = claim_cost(&flow.db, &flow.topic).await;
    sleep_until_ms(stopped + UNWRITABLE_FOR.as_millis() as i64).await;
    let (pg_late, worker_late) = (pg_cpu_ticks(&flow.db).await, cpu_ticks(pid));
    let late = now_ms();
    let samples = rss.stop();
    let published_in_outage = flow.published_count().await - published_at_stop;
    let waiting = due - flow.published_count().await;
    let errors = produce_error_codes(&flow.metrics_addr).await;
    let activity = Activity::start(&flow.db).await;
    let launched = now_ms();
    blocking(|| cluster.launch_node(P0_FOLLOWER));
    faults.up(P0_FOLLOWER, launched);
    progress(&format!("node {P0_FOLLOWER} launched again"));
    let (synced_at, end) = flow.partition_0_in_sync_again("again").await;
    let statements = activity.stop(from, 8).await;
    let one_partition::Ended {
        fin,
        checked,
        worker: w,
        java: j,
    } = one_partition::end(flow, cluster, &faults, (from, end), report, NAME).await;
    report.step(
        &format!(
            "{NAME} (node {P0_FOLLOWER} stopped in {}, down {}, in sync again {} after its launch)",
            secs(stop_took),
            secs(ms(launched - stopped)),
            secs(ms(synced_at - launched))
        ),
        &w,
        &j,
        GapGoal::Partitions,
    );
    let (qw, qj) = both(
        &fin,
        &checked.appended,
        &Faults::default(),
        (quiet_from, from),
    );
    report.line(format!(
        "{NAME}: in the 3 s before, without a fault: partition gaps worker {}, java {}",
        render_gaps(&qw),
        render_gaps(&qj)
    ));
    report.line(format!(
        "{NAME}: partition 0 as the watcher saw it: {}",
        one_partition::render_timeline(&fin.timelines, &fin.topic, 0, from, end)
    ));
    report.line(format!(
        "{NAME}: the longest statements from the launch on: {statements}"
    ));
    report.line(format!(
        "{NAME}: CPU of PostgreSQL / of the worker: {} / {} in the 3 s before, {} / {} during the outage; \
         one claim (partition 0 left out) before the stop: {claim_before}; 2 s before the end: {claim_late}",
        cpu_pct(pg_from.saturating_sub(pg_quiet), from - quiet_from),
        cpu_pct(worker_from.saturating_sub(worker_quiet), from - quiet_from),
        cpu_pct(pg_late.saturating_sub(pg_stopped), late - stopped),
        cpu_pct(worker_late.saturating_sub(worker_stopped), late - stopped),
    ));
    report.line(format!(
        "{NAME}: during the outage the worker published {published_in_outage} rows \
         (partitions 1 and 2) while {waiting} waited at its end; produce errors {errors:?}; \
         {} WARN/ERROR log lines in the whole flow",
        warn_error_lines(&fin.log)
    ));
    one_partition::copies_goal(report, NAME, &checked);
    let warm = samples
        .iter()
        .find(|(at, _)| *at >= stopped + RSS_WARM_UP.as_millis() as i64)
        .copied();
    let last = samples.last().copied();
    let (Some((_, warm)), Some((_, last))) = (warm, last) else {
        report.goal(NAME, false, format!("worker RSS sampled: {samples:?}"));
        return;
    };
    let (low, high) = samples.iter().fold((i64::MAX, i64::MIN), |(l, h), (_, k)| {
        (l.min(*k), h.max(*k))
    });
    report.goal(
        NAME,
        last - warm < RSS_BOUND_KIB,
        format!(
            "memory flat: worker RSS {} before the stop, {} {} into the outage, {} at its end \
             ({:+.1} MiB, bound < +{}; range {}–{} over {} samples)",
            mib(rss_before),
            mib(warm),
            secs(RSS_WARM_UP),
            mib(last),
            (last - warm) as f64 / 1024.0,
            mib(RSS_BOUND_KIB),
            mib(low),
            mib(high),
            samples.len()
        ),
    );
}
