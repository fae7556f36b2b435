//! `slow`: one partition slow for 25 s (its only follower frozen).

use super::*;

/// The second scenario, on the defaults cluster: on the same
/// layout, partition 0's only follower frozen with SIGSTOP for
/// [`FROZEN_FOR`], then thawed with SIGCONT. It stays in the ISR as long as
/// the cluster keeps it there (`replica.lag.time.max.ms` is 30 s; the
/// watcher's timeline of partition 0 is printed), so partition 0's acks=all
/// requests wait while partitions 1 and 2 answer at once. Invariant: every
/// booking on the topic, duplicates with the same `ce_id` and bytes.
/// Goals: partitions 1 and 2 never stall 1 s; no event written more than
/// twice. How partition 0 resumed is printed.
pub(super) async fn one_partition_slow(cluster: &Cluster, files: &Path, report: &mut Report) {
    const NAME: &str = "one partition slow";
    let flow = one_partition::start(cluster, files, FROZEN_FOR + Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut faults = Faults::default();
    let from = now_ms();
    blocking(|| cluster.freeze(P0_FOLLOWER));
    let frozen = now_ms();
    // Writes to partition 0 wait for it: not writable while frozen.
    faults.down(P0_FOLLOWER, frozen);
    progress(&format!(
        "node {P0_FOLLOWER} (partition 0's only follower) frozen"
    ));
    let published_at_freeze = flow.published_count().await;
    // The scenario's definition: frozen this long.
    sleep_until_ms(frozen + FROZEN_FOR.as_millis() as i64).await;
    let published_frozen = flow.published_count().await - published_at_freeze;
    let activity = Activity::start(&flow.db).await;
    blocking(|| cluster.thaw(P0_FOLLOWER));
    let thawed = now_ms();
    faults.up(P0_FOLLOWER, thawed);
    progress(&format!("node {P0_FOLLOWER} thawed"));
    let (synced_at, end) = flow.partition_0_in_sync_again("after the thaw").await;
    let statements = activity.stop(from, 8).await;
    let errors = produce_error_codes(&flow.metrics_addr).await;
    let one_partition::Ended {
        fin,
        checked,
        worker: w,
        java: j,
    } = one_partition::end(flow, cluster, &faults, (from, end), report, NAME).await;
    report.step(
        &format!(
            "{NAME} (node {P0_FOLLOWER} frozen {}, 2 in sync {} after the thaw)",
            secs(ms(thawed - frozen)),
            secs(ms(synced_at.max(thawed) - thawed))
        ),
        &w,
        &j,
        GapGoal::Partitions,
    );
    report.line(format!(
        "{NAME}: partition 0 as the watcher saw it: {}",
        one_partition::render_timeline(&fin.timelines, &fin.topic, 0, from, end)
    ));
    report.line(format!(
        "{NAME}: the longest statements from the thaw on: {statements}"
    ));
    report.line(format!(
        "{NAME}: while frozen the worker published {published_frozen} rows; produce errors {errors:?}; \
         {} WARN/ERROR log lines in the whole flow",
        warn_error_lines(&fin.log)
    ));
    one_partition::copies_goal(report, NAME, &checked);
}
