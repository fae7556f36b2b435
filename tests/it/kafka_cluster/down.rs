//! `down`: two brokers down at once (NOT_ENOUGH_REPLICAS), both launched
//! again.

use super::*;

/// Invariant: two of three brokers down (produces fail with
/// NOT_ENOUGH_REPLICAS): rows wait in the outbox, `/readyz` is 503, the
/// worker keeps expiring; both started again after about 10 s, publishing
/// resumes by itself and nothing is lost. Goal: each partition publishes
/// again < 1 s after it has enough in-sync replicas again.
pub(super) async fn two_brokers_down(cluster: &Cluster, files: &Path, report: &mut Report) {
    let flow = Flow::start(cluster, files, &rf3_layout(), Duration::from_secs(45)).await;
    let due = flow.due;
    flow.wait_published(2_000, Duration::from_secs(60)).await;
    wait_http_status(&flow.metrics_addr, "/readyz", 200, Duration::from_secs(30)).await;
    let mut faults = Faults::default();
    let from = now_ms();
    for node in [2, 3] {
        blocking(|| cluster.stop_node(node));
        faults.down(node, now_ms());
    }
    progress("nodes 2 and 3 stopped");
    let down_at = Instant::now();
    wait_http_status(&flow.metrics_addr, "/readyz", 503, Duration::from_secs(30)).await;
    let not_ready_after = down_at.elapsed();
    // Whatever was in flight settles, then nothing more gets published.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (published_before, expired_before) =
        (flow.published_count().await, flow.expired_count().await);
    // Deliberate fault timing: the outage lasts about DOWN_FOR.
    let rest = DOWN_FOR.saturating_sub(down_at.elapsed());
    tokio::time::sleep(rest.max(Duration::from_secs(2))).await;
    let (published_after, expired_after) =
        (flow.published_count().await, flow.expired_count().await);
    assert_eq!(
        readyz(&flow.metrics_addr).await,
        Some(503),
        "/readyz during the outage"
    );
    assert_eq!(
        published_after, published_before,
        "nothing is acknowledged without min.insync.replicas"
    );
    assert!(
        expired_after > expired_before,
        "the worker keeps expiring ({expired_before} -> {expired_after})"
    );
    let errors = produce_error_codes(&flow.metrics_addr).await;
    let outage = down_at.elapsed();
    for node in [2, 3] {
        blocking(|| cluster.launch_node(node));
        faults.up(node, now_ms());
    }
    progress("nodes 2 and 3 launched");
    let back_at = Instant::now();
    wait_until("publishing resumes", Duration::from_secs(120), || async {
        flow.published_count().await > published_after
    })
    .await;
    let resumed_after = back_at.elapsed();
    let synced_at = flow
        .wait_watched(
            "all replicas in sync after two brokers were down",
            Duration::from_secs(120),
            in_sync,
        )
        .await;
    wait_http_status(&flow.metrics_addr, "/readyz", 200, Duration::from_secs(60)).await;
    let ready_after = back_at.elapsed();
    let end = synced_at.max(now_ms());
    let fin = flow.finish().await;
    let checked = check_topic(cluster, &fin.topic, 3, due, |_| vec![3]);
    let worker_acks = &checked.appended;
    let (w, j) = both(&fin, worker_acks, &faults, (from, end));
    report.step(
        &format!(
            "two brokers down (outage {}, {} rows waiting, both launched again)",
            secs(outage),
            due - published_after
        ),
        &w,
        &j,
        GapGoal::Topic,
    );
    report.line(format!(
        "two brokers down: /readyz 503 after {}, worker expired {} meanwhile, produce errors {errors:?}; \
         publishing resumed {} and /readyz 200 {} after the launches; {}",
        secs(not_ready_after),
        expired_after - expired_before,
        secs(resumed_after),
        secs(ready_after),
        checked.summary(),
    ));
}
