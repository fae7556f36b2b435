//! `kill`: the leader of partition 0 killed with `kill -9` mid-publish.

use super::*;

/// Invariant: the leader of partition 0 killed with `kill -9` mid-publish:
/// nothing lost. Goal: every partition publishes again < 1 s after it is
/// writable again (the new leader elected, or the ISR shrunk without the
/// dead follower). The node is launched again once the cluster fenced it.
pub(super) async fn leader_killed(cluster: &Cluster, files: &Path, report: &mut Report) {
    let flow = Flow::start(cluster, files, &rf3_layout(), Duration::from_secs(30)).await;
    let due = flow.due;
    flow.wait_published(3_000, Duration::from_secs(60)).await;
    let leader = blocking(|| cluster.describe(&flow.topic))[0].leader;
    let mut faults = Faults::default();
    // Dead from before the command (conservative for "writable"); figures
    // "after the kill" count from its return (`kill -9`, then waiting
    // until the process is gone; starting the script takes a second or two).
    let killed_at = now_ms();
    blocking(|| cluster.kill(leader));
    faults.down(leader, killed_at);
    let kill_returned = now_ms();
    progress(&format!("node {leader} (leader of partition 0) killed"));
    let left = due - flow.published_count().await;
    let clear_at = flow
        .wait_watched(
            &format!("node {leader} out of every leadership and ISR"),
            Duration::from_secs(90),
            |o| o.leader >= 0 && o.leader != leader && !o.isr.contains(&leader),
        )
        .await;
    progress(&format!(
        "node {leader} out of every leadership and ISR {} after the kill",
        secs(ms(clear_at - kill_returned))
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let to = now_ms();
    blocking(|| cluster.launch_node(leader));
    faults.up(leader, now_ms());
    let fin = flow.finish().await;
    wait_in_sync(cluster, &fin.topic, Duration::from_secs(120)).await;
    let checked = check_topic(cluster, &fin.topic, 3, due, |_| vec![3]);
    let worker_acks = &checked.appended;
    let (w, j) = both(&fin, worker_acks, &faults, (killed_at, to));
    report.step(
        &format!(
            "kill -9 of leader node {leader} ({left} of {due} rows to publish; out of every \
             leadership and ISR {} after the kill)",
            secs(ms(clear_at - kill_returned))
        ),
        &w,
        &j,
        GapGoal::Topic,
    );
    report.line(format!("kill: {}", checked.summary()));
    assert!(
        left > 1_000,
        "the kill came too late to measure ({left} rows left)"
    );
}
