//! What a scenario measures and asserts: which partitions were writable
//! when ([`Faults`]), the gaps between acknowledgements and the resumes
//! after a partition became writable again ([`measure`]), for the worker
//! and the Java producer side by side, and the goals with their excuse
//! rule ([`Report`]).

use super::*;

/// The nodes the test took down: (node, down from, up from) in epoch ms.
#[derive(Default)]
pub(super) struct Faults {
    pub(super) down: Vec<(i32, i64, Option<i64>)>,
}

impl Faults {
    pub(super) fn down(&mut self, node: i32, at: i64) {
        self.down.push((node, at, None));
    }

    pub(super) fn up(&mut self, node: i32, at: i64) {
        if let Some(d) = self
            .down
            .iter_mut()
            .rev()
            .find(|d| d.0 == node && d.2.is_none())
        {
            d.2 = Some(at);
        }
    }

    pub(super) fn alive(&self, node: i32, t: i64) -> bool {
        !self
            .down
            .iter()
            .any(|&(n, from, to)| n == node && t >= from && to.is_none_or(|to| t < to))
    }

    /// Writable per the issue: a live leader, at least 2 in-sync replicas,
    /// none of them dead (acks=all waits for every ISR member).
    pub(super) fn writable(&self, state: &Observed, t: i64) -> bool {
        state.leader >= 0
            && self.alive(state.leader, t)
            && state.isr.len() >= 2
            && state.isr.iter().all(|&n| self.alive(n, t))
    }
}

/// One client's figures for one step.
pub(super) struct Figures {
    /// The longest gap between two acknowledgements on the topic that
    /// overlaps the step.
    pub(super) topic_gap: Duration,
    /// The same per partition.
    pub(super) gaps: BTreeMap<i32, Duration>,
    /// When each partition's longest gap began, from the step's start.
    pub(super) gap_at: BTreeMap<i32, Duration>,
    /// Per partition that was not writable at some moment of the step:
    /// each moment in the step it became writable again.
    pub(super) resumes: BTreeMap<i32, Vec<Resume>>,
}

/// A partition writable again.
#[derive(Debug, Clone, Copy)]
pub(super) struct Resume {
    /// When it was writable again (epoch ms).
    pub(super) at: i64,
    /// From then to the first acknowledgement after it (None: none came).
    pub(super) after: Option<Duration>,
}

pub(super) fn ms(d: i64) -> Duration {
    Duration::from_millis(d.max(0) as u64)
}

/// The longest gap between consecutive times within `[from, to]`: a gap
/// that straddles a bound counts only its part inside, so a stall that
/// begins with the next step's fault is that step's, not this one's.
pub(super) fn longest_gap(times: &[i64], from: i64, to: i64) -> Duration {
    longest_gap_at(times, from, to).0
}

/// [`longest_gap`] and when it began (epoch ms; `from` when none).
pub(super) fn longest_gap_at(times: &[i64], from: i64, to: i64) -> (Duration, i64) {
    times
        .windows(2)
        .filter(|pair| pair[1] >= from && pair[0] <= to)
        .map(|pair| {
            let start = pair[0].max(from);
            (ms(pair[1].min(to) - start), start)
        })
        .max()
        .unwrap_or((Duration::ZERO, from))
}

/// One client's figures for the step `[from, to]` on `topic`; writable-again
/// moments after the client's last acknowledgement (it had published
/// everything) do not count.
pub(super) fn measure(
    acks: &Acks,
    timelines: &Timelines,
    topic: &str,
    faults: &Faults,
    (from, to): (i64, i64),
) -> Figures {
    let mut all: Vec<i64> = acks.values().flatten().copied().collect();
    all.sort_unstable();
    let idle_after = all.last().copied().unwrap_or(i64::MIN);
    let partitions: BTreeSet<i32> = timelines
        .keys()
        .filter(|(t, _)| t == topic)
        .map(|(_, p)| *p)
        .chain(acks.keys().copied())
        .collect();
    let empty = Vec::new();
    let mut gaps = BTreeMap::new();
    let mut gap_at = BTreeMap::new();
    let mut resumes = BTreeMap::new();
    for p in partitions {
        let times = acks.get(&p).unwrap_or(&empty);
        let (gap, at) = longest_gap_at(times, from, to);
        gaps.insert(p, gap);
        gap_at.insert(p, ms(at - from));
        let timeline = timelines
            .get(&(topic.to_owned(), p))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let writable_at = |t: i64| {
            timeline
                .iter()
                .take_while(|o| o.at_ms <= t)
                .last()
                .is_none_or(|o| faults.writable(o, t))
        };
        let mut moments: Vec<i64> = timeline
            .iter()
            .map(|o| o.at_ms)
            .chain(
                faults
                    .down
                    .iter()
                    .flat_map(|&(_, a, b)| std::iter::once(a).chain(b)),
            )
            .filter(|&t| t > from && t <= to)
            .collect();
        moments.sort_unstable();
        moments.dedup();
        let mut was = writable_at(from);
        let mut unwritable = !was;
        let mut again = Vec::new();
        for t in moments {
            let now = writable_at(t);
            if now && !was && t <= idle_after {
                let first = times.iter().find(|&&a| a >= t);
                again.push(Resume {
                    at: t,
                    after: first.map(|a| ms(a - t)),
                });
            }
            unwritable |= !now;
            was = now;
        }
        if unwritable {
            resumes.insert(p, again);
        }
    }
    Figures {
        topic_gap: longest_gap(&all, from, to),
        gaps,
        gap_at,
        resumes,
    }
}

pub(super) fn secs2(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Each partition's longest gap, and when it began (from the step's
/// start) when it was half the goal or more.
pub(super) fn render_gaps(f: &Figures) -> String {
    f.gaps
        .iter()
        .map(|(p, g)| match f.gap_at.get(p) {
            Some(at) if *g >= GOAL / 2 => format!("p{p} {} at +{}", secs2(*g), secs(*at)),
            _ => format!("p{p} {}", secs2(*g)),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn render_resumes(f: &Figures) -> String {
    if f.resumes.is_empty() {
        return "always writable".into();
    }
    f.resumes
        .iter()
        .map(|(p, rs)| {
            if rs.is_empty() {
                format!("p{p} not writable again in this step")
            } else {
                let list: Vec<String> = rs
                    .iter()
                    .map(|r| r.after.map_or_else(|| "never".into(), secs2))
                    .collect();
                format!("p{p} {}", list.join("/"))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which gaps a step's goal is on, for the partitions that stayed writable
/// the whole step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GapGoal {
    /// The measure for a fault of the whole cluster (a rolling
    /// step): the longest gap between records on the topic. Per-partition
    /// gaps are printed, not asserted: a partition whose new leader waits
    /// for a follower that just restarted acknowledges late for any client.
    Topic,
    /// A fault of one partition: each partition that stayed writable (a
    /// healthy one) on its own, without the excuse rule: the cluster kept
    /// it writable the whole step (its watcher says so), so nothing of the
    /// cluster's excuses a stall there. The Java producer's figure is
    /// printed beside it, and it can be long for a reason of its own: one
    /// request per broker carries every partition that broker leads, so
    /// its partition 2 (led by node 1 like partition 0) waits with
    /// partition 0's acks=all request.
    Partitions,
}

/// A goal the worker missed, with the Java producer's figure for the same
/// partition (or topic) at the same moment, when it has one.
pub(super) struct Miss {
    pub(super) what: String,
    pub(super) worker: Duration,
    pub(super) java: Option<Duration>,
    /// Whether the excuse rule applies at all (see [`GapGoal::Partitions`]).
    pub(super) excusable: bool,
}

impl Miss {
    /// The excuse rule: the Java producer missed the same goal on the same
    /// partition in the same step (the cluster's doing), and the worker
    /// stayed within [`EXCUSE`] of it.
    pub(super) fn excused(&self) -> bool {
        self.excusable
            && self
                .java
                .is_some_and(|j| j >= GOAL && self.worker <= j.saturating_add(EXCUSE))
    }

    pub(super) fn java(&self) -> String {
        match self.java {
            Some(Duration::MAX) => "java never".into(),
            Some(j) => format!("java {}", secs2(j)),
            None => "java: no figure to compare".into(),
        }
    }
}

/// The Java producer's resume on `partition` nearest to the worker's
/// writable-again moment `at` (both topics have the same assignment, so
/// their moments differ by the watcher's poll at most; a second apart at
/// most counts as the same). `Duration::MAX`: it never resumed.
pub(super) fn java_resume(java: &Figures, partition: i32, at: i64) -> Option<Duration> {
    java.resumes
        .get(&partition)?
        .iter()
        .filter(|r| (r.at - at).abs() <= 1_000)
        .min_by_key(|r| (r.at - at).abs())
        .map(|r| r.after.unwrap_or(Duration::MAX))
}

/// The figures of every step and the goals the worker missed.
#[derive(Default)]
pub(super) struct Report {
    pub(super) profile: &'static str,
    pub(super) lines: Vec<String>,
    pub(super) missed: Vec<String>,
}

impl Report {
    pub(super) fn line(&mut self, line: String) {
        eprintln!("FIGURES kafka-cluster[{}]: {line}", self.profile);
        self.lines.push(format!("[{}] {line}", self.profile));
    }

    /// A goal of the worker alone (no Java figure to compare): printed,
    /// and counted when missed.
    pub(super) fn goal(&mut self, name: &str, met: bool, what: String) {
        let verdict = if met { "met" } else { "MISSED" };
        self.line(format!("{name}: goal {verdict}: {what}"));
        if !met {
            self.missed
                .push(format!("[{}] {name}: {what}", self.profile));
        }
    }

    /// Prints the step's figures for both clients and checks the worker's
    /// against the goals: while writable, gaps (per `gap_goal`) < [`GOAL`];
    /// each time a partition is writable again, its next record < [`GOAL`]
    /// after. A miss is excused only by the rule of [`Miss::excused`].
    pub(super) fn step(&mut self, name: &str, worker: &Figures, java: &Figures, gap_goal: GapGoal) {
        self.line(format!(
            "{name}: topic gap worker {}, java {}; partition gaps worker {}, java {}; \
             resumed after writable again worker {}, java {}",
            secs2(worker.topic_gap),
            secs2(java.topic_gap),
            render_gaps(worker),
            render_gaps(java),
            render_resumes(worker),
            render_resumes(java),
        ));
        let mut misses = Vec::new();
        match gap_goal {
            GapGoal::Topic => {
                if worker.resumes.is_empty() && worker.topic_gap >= GOAL {
                    misses.push(Miss {
                        what: format!(
                            "the topic stayed writable but publishing stalled {} (goal < {})",
                            secs2(worker.topic_gap),
                            secs2(GOAL)
                        ),
                        worker: worker.topic_gap,
                        java: java.resumes.is_empty().then_some(java.topic_gap),
                        excusable: true,
                    });
                }
            }
            GapGoal::Partitions => {
                for (p, gap) in &worker.gaps {
                    if worker.resumes.contains_key(p) || *gap < GOAL {
                        continue;
                    }
                    misses.push(Miss {
                        what: format!(
                            "partition {p} stayed writable but stalled {} (goal < {})",
                            secs2(*gap),
                            secs2(GOAL)
                        ),
                        worker: *gap,
                        java: (!java.resumes.contains_key(p))
                            .then(|| java.gaps.get(p).copied())
                            .flatten(),
                        excusable: false,
                    });
                }
            }
        }
        for (p, resumes) in &worker.resumes {
            for r in resumes {
                let what = match r.after {
                    Some(d) if d < GOAL => continue,
                    Some(d) => format!(
                        "partition {p} resumed {} after it was writable again (goal < {})",
                        secs2(d),
                        secs2(GOAL)
                    ),
                    None => format!("partition {p} did not resume after it was writable again"),
                };
                misses.push(Miss {
                    what,
                    worker: r.after.unwrap_or(Duration::MAX),
                    java: java_resume(java, *p, r.at),
                    excusable: true,
                });
            }
        }
        for miss in misses {
            if miss.excused() {
                self.line(format!(
                    "{name}: {}; {}, within {} of it: bound by the cluster, not counted",
                    miss.what,
                    miss.java(),
                    secs2(EXCUSE)
                ));
            } else {
                self.missed.push(format!(
                    "[{}] {name}: {} ({})",
                    self.profile,
                    miss.what,
                    miss.java()
                ));
            }
        }
    }
}

/// Both clients' figures of `window` on the finished flow.
pub(super) fn both(
    fin: &Finished,
    worker_acks: &Acks,
    faults: &Faults,
    window: (i64, i64),
) -> (Figures, Figures) {
    (
        measure(worker_acks, &fin.timelines, &fin.topic, faults, window),
        measure(
            &fin.java_acks,
            &fin.timelines,
            &fin.java_topic,
            faults,
            window,
        ),
    )
}
