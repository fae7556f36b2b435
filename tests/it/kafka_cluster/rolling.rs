//! `rolling`: each broker in turn restarted with a controlled shutdown.

use super::*;

/// Invariant: each broker in turn stopped with SIGTERM (controlled
/// shutdown, until it exited), launched again 2 s later without waiting
/// for it, the next one 4 s after that, while publishing: nothing lost.
/// Goal per step: a topic that stayed writable stalls < 1 s; a partition left
/// with fewer than 2 in-sync replicas (the next node stopped before the
/// restarted one rejoined) publishes again < 1 s after it is writable again.
pub(super) async fn rolling_restart(cluster: &Cluster, files: &Path, report: &mut Report) {
    let flow = Flow::start(cluster, files, &rf3_layout(), Duration::from_secs(60)).await;
    let due = flow.due;
    flow.wait_published(2_000, Duration::from_secs(60)).await;
    let quiet_from = now_ms();
    // Deliberate fault timing: some publishing without a fault, to compare.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut faults = Faults::default();
    let mut steps = Vec::new();
    for node in 1..=3 {
        let from = now_ms();
        let t = Instant::now();
        blocking(|| cluster.stop_node(node));
        let stop_took = t.elapsed();
        let exited = now_ms();
        faults.down(node, exited);
        progress(&format!("node {node} stopped in {}", secs(stop_took)));
        sleep_until_ms(exited + RELAUNCH_AFTER.as_millis() as i64).await;
        let launched = now_ms();
        blocking(|| cluster.launch_node(node));
        faults.up(node, launched);
        let left = due - flow.published_count().await;
        steps.push((node, from, stop_took, left));
        sleep_until_ms(launched + NEXT_STEP_AFTER.as_millis() as i64).await;
    }
    let synced_at = flow
        .wait_watched(
            "all replicas in sync after the rolling restart",
            Duration::from_secs(120),
            in_sync,
        )
        .await;
    progress(&format!(
        "all replicas in sync {} after the last step began",
        secs(ms(synced_at - steps[2].1))
    ));
    let end = synced_at.max(now_ms());
    let fin = flow.finish().await;
    let checked = check_topic(cluster, &fin.topic, 3, due, |_| vec![3]);
    let worker_acks = &checked.appended;
    for (i, (node, from, stop_took, left)) in steps.iter().enumerate() {
        let to = steps.get(i + 1).map_or(end, |s| s.1);
        let (w, j) = both(&fin, worker_acks, &faults, (*from, to));
        report.step(
            &format!(
                "rolling node {node} (shutdown took {}, {left} rows left at its relaunch, step {})",
                secs(*stop_took),
                secs(ms(to - from))
            ),
            &w,
            &j,
            GapGoal::Topic,
        );
    }
    let (w, j) = both(
        &fin,
        worker_acks,
        &Faults::default(),
        (quiet_from, steps[0].1),
    );
    report.line(format!(
        "rolling: in the 5 s before, without a fault: topic gap worker {}, java {}; partition gaps worker {}, java {}; \
         {}",
        secs2(w.topic_gap),
        secs2(j.topic_gap),
        render_gaps(&w),
        render_gaps(&j),
        checked.summary(),
    ));
    assert!(
        steps[0].3 > 0,
        "the flow ended before the first restart step finished"
    );
}
