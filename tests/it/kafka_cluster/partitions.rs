//! `partitions`: partitions added to the topic while the worker publishes.

use super::*;

/// Invariant: partitions added to the topic while publishing: records use
/// the new count at most `METADATA_MAX_AGE` (plus one call) after the
/// change, the old one before it; nothing lost. The deadlines span 30 s so
/// that rows still fall due longer than that bound after the change (made
/// once 2,000 are published, 12–14 s in on 2 cores): with 20 s the flow
/// once ended 5.9 s after the change, before the bound, with no record on
/// a new partition to find.
pub(super) async fn partitions_added(cluster: &Cluster, files: &Path, report: &mut Report) {
    let flow = Flow::start(cluster, files, &rf3_layout(), Duration::from_secs(30)).await;
    let due = flow.due;
    flow.wait_published(2_000, Duration::from_secs(60)).await;
    let before = wall_now();
    blocking(|| cluster.add_partitions(1, &flow.topic, 6));
    progress("partitions added");
    let after = wall_now();
    let left = due - flow.published_count().await;
    let fin = flow.finish().await;
    let published = Flow::published_of(&fin.db).await;
    let at: HashMap<String, DateTime<Utc>> = published
        .iter()
        .map(|p| (p.message_key.clone(), p.published_at))
        .collect();
    // Either count is right for a record acknowledged within one metadata
    // refresh (plus the call in flight, 3 s) of the change.
    let bound =
        chrono::Duration::from_std(Timing::default().metadata_max_age + Duration::from_secs(3))
            .expect("bound");
    let checked = check_topic(cluster, &fin.topic, 6, due, |key| {
        let t = at[key];
        if t < before {
            vec![3]
        } else if t > after + bound {
            vec![6]
        } else {
            vec![3, 6]
        }
    });
    let first_new = published
        .iter()
        .filter(|p| checked.partition_of[&p.message_key] >= 3)
        .map(|p| p.published_at)
        .min()
        .expect("records on the new partitions");
    let picked_up = (first_new - after).to_std().unwrap_or_default();
    report.line(format!(
        "partitions 3 -> 6 with {left} rows to publish: first record on a new partition {} after the change \
         (bound {} + one call); {}",
        secs(picked_up),
        secs(Timing::default().metadata_max_age),
        checked.summary(),
    ));
    assert!(
        left > 5_000,
        "the change came too late to measure ({left} rows left)"
    );
}
