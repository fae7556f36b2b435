//! `worker-kill`: the `run` process killed with `kill -9` while it
//! publishes, and a new one started.

use super::*;

/// Invariant: the `run` process killed with `kill -9` while it publishes
/// (requests on the way, rows leased), a new one started at once: every
/// booking on the topic, duplicates only with the same `ce_id` and bytes.
/// The killed instance's leases end on their own (`Timing::lease`); its
/// rows are published by the new one then.
pub(super) async fn worker_killed(cluster: &Cluster, files: &Path, report: &mut Report) {
    let mut flow = Flow::start(cluster, files, &rf3_layout(), Duration::from_secs(20)).await;
    let due = flow.due;
    flow.wait_published(3_000, Duration::from_secs(60)).await;
    let published = flow.published_count().await;
    flow.kill_worker().await;
    let killed = Instant::now();
    let leased = flow
        .db
        .count(
            "SELECT count(*) AS n FROM booking_expiration_outbox \
             WHERE published_at IS NULL AND claimed_until > now()",
        )
        .await;
    progress(&format!(
        "run killed with {published} of {due} rows published, {leased} leased by it"
    ));
    flow.start_worker();
    let fin = flow.finish().await;
    let all_after = killed.elapsed();
    let checked = check_topic(cluster, &fin.topic, 3, due, |_| vec![3]);
    report.line(format!(
        "kill -9 of the worker: {published} of {due} rows published at the kill, {leased} leased \
         by the killed instance (lease {}); a new one published everything {} after; {}",
        secs(Timing::default().lease),
        secs(all_after),
        checked.summary()
    ));
    assert!(
        published < due - 5_000,
        "the kill came too late to measure ({published} of {due} published)"
    );
}
