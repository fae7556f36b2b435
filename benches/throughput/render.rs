//! The one renderer of a run: the figures table with its goals, the raw
//! samples of every figure, the profile pass, the idle cycle's plans and
//! the expiry details, all as Markdown from a [`Results`] (a fresh run's
//! or one read back from `results.json`). docs/benchmarks.md pastes its
//! output (README.md quotes a few rows of the figures table without its
//! load column, which tests/docs.rs holds to benchmarks.md's); nothing
//! else formats a figure.

use std::fmt::Write as _;

use crate::{
    figures::{
        deadline_wake::{DeadlineToKafka, LateArrivals, Lateness, Mode, Statements},
        end_to_end::EndToEnd,
        expiry::{self, Comparison},
        logging::{self, LoggingFigure},
        migrations::MigrationsFigure,
        outbox_cost::{self, OutboxCost},
        profile::ProfileRun,
        publisher::PublisherFigure,
        replay::ReplayFigure,
        schema_cost::{LeanFigure, SchemaCost},
        sustained::{self, Sustained},
    },
    results::Results,
    support::{Stat, num},
};

// The goals: the project's (0.9x, 0.9x, 1.1x, 10 ms, 64 MiB) and the spec's (60 s).
/// Worker over raw SQL, bookings/s, in the headline figure.
const EXPIRY_GOAL: f64 = 0.9;
/// Publisher over DB-only (#32).
const PUBLISHER_GOAL: f64 = 0.9;
/// PostgreSQL's CPU and WAL per event after the pipeline over before (#32).
const PG_WORK_GOAL: f64 = 1.1;
const IDLE_GOAL_MS: f64 = 10.0;
/// Every end-to-end run.
const END_TO_END_GOAL_S: f64 = 60.0;
/// Every run's p99: below `OUTBOX_POLL_INTERVAL` of the run, so only the
/// wake-up on commit can explain it.
const P99_GOAL_MS: f64 = 10_000.0;
const RSS_GOAL_MIB: f64 = 64.0;
/// Deadline-driven lateness p99 (the goal: within 1 s of the deadline).
const LATENESS_P99_GOAL_S: f64 = 1.0;
/// Deadline → record on Kafka p99 (the goal: about a second more).
const KAFKA_P99_GOAL_S: f64 = 2.0;
/// A replay from a year of audit trail over the same replay from a trail
/// a hundred times smaller: time follows the selection, not the trail.
const REPLAY_RATIO_GOAL: f64 = 1.5;

/// Everything, in the order a run prints it.
pub fn report(r: &Results) -> String {
    let mut out = String::new();
    out.push_str(&header(r));
    out.push('\n');
    out.push_str(&figures_table(r));
    out.push('\n');
    out.push_str(&raw_numbers(r));
    out.push('\n');
    out.push_str(&plans_and_details(r));
    out
}

/// One line: when, where, with which PostgreSQL; then, when `BENCH_ONLY`
/// kept figures of earlier runs, which run measured which figure.
pub fn header(r: &Results) -> String {
    let pg = |name: &str| r.postgresql.get(name).map_or("?", String::as_str);
    let short = |t: &str| t.get(..19).unwrap_or(t).to_owned();
    let mut out = format!(
        "Run finished {}Z, {} mode, {} cores, PostgreSQL {}, fsync={}, synchronous_commit={}, shared_buffers={}.\n",
        short(&r.finished_at),
        r.mode,
        r.machine.cores,
        pg("server_version"),
        pg("fsync"),
        pg("synchronous_commit"),
        pg("shared_buffers"),
    );
    let earlier: Vec<String> = r
        .measured
        .iter()
        .filter(|(_, stamp)| stamp.finished_at != r.finished_at)
        .map(|(figure, stamp)| {
            format!(
                "{figure} ({} run {}Z)",
                stamp.mode,
                short(&stamp.finished_at)
            )
        })
        .collect();
    if !earlier.is_empty() {
        let _ = writeln!(
            out,
            "This run measured {}; kept from earlier runs (`BENCH_ONLY`): {}.",
            r.measured
                .iter()
                .filter(|(_, stamp)| stamp.finished_at == r.finished_at)
                .map(|(figure, _)| figure.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            earlier.join(", ")
        );
    }
    out
}

/// The expiry figures in table order (any unknown key last, by key).
fn comparisons(r: &Results) -> Vec<(&str, &Comparison)> {
    let mut out: Vec<(&str, &Comparison)> = expiry::configs()
        .filter_map(|c| r.expiry.get_key_value(c.key))
        .map(|(k, c)| (k.as_str(), c))
        .collect();
    for (key, c) in &r.expiry {
        if !expiry::configs().any(|config| config.key == key) {
            out.push((key, c));
        }
    }
    out
}

struct Row {
    figure: String,
    project: String,
    baseline: String,
    ratio: String,
    goal: String,
    met: String,
    load: [f64; 3],
}

fn met(ok: bool) -> String {
    if ok { "yes".into() } else { "NO".into() }
}

fn rates(s: &Stat, unit: &str) -> String {
    format!("{} {unit}", s.show(num))
}

fn fixed(s: &Stat, decimals: usize, unit: &str) -> String {
    format!("{} {unit}", s.show(|v| format!("{v:.decimals$}")))
}

/// The figures with their baselines, ratios and goals.
pub fn figures_table(r: &Results) -> String {
    let mut rows = Vec::new();
    for (key, c) in comparisons(r) {
        let goal = (key == expiry::HEADLINE.key).then_some(EXPIRY_GOAL);
        rows.push(Row {
            figure: c.label.clone(),
            project: rates(&c.worker_bookings_per_s, "bookings/s"),
            baseline: rates(&c.raw_sql_bookings_per_s, "bookings/s"),
            ratio: format!("{:.2}x", c.ratio),
            goal: goal.map_or("-".into(), |g| format!(">= {g}x")),
            met: goal.map_or("-".into(), |g| met(c.ratio >= g)),
            load: c.loadavg_at_start,
        });
    }
    if let Some(logging) = &r.logging {
        logging_rows(logging, &mut rows);
    }
    if let Some(lean) = &r.lean {
        lean_rows(lean, &mut rows);
    }
    if let Some(idle) = &r.idle_cycle {
        rows.push(Row {
            figure: format!("idle cycle (0 due) over {} bookings", idle.table_rows),
            project: fixed(&idle.ms, 2, "ms"),
            baseline: "-".into(),
            ratio: "-".into(),
            goal: format!("<= {IDLE_GOAL_MS} ms, partial indexes used"),
            met: met(idle.ms.median <= IDLE_GOAL_MS && idle.partial_indexes_used),
            load: idle.loadavg_at_start,
        });
    }
    if let Some(p) = &r.publisher {
        publisher_rows(p, &mut rows);
    }
    if let Some(c) = &r.outbox_cost {
        outbox_cost_rows(c, &mut rows);
    }
    if let Some(e) = &r.end_to_end {
        end_to_end_rows(e, &mut rows);
    }
    rows.push(Row {
        figure: "release binary size (bench profile = release: thin LTO, stripped)".into(),
        project: format!("{:.2} MiB", r.binary.bytes as f64 / 1048576.0),
        baseline: "-".into(),
        ratio: "-".into(),
        goal: "-".into(),
        met: "-".into(),
        load: r.machine.loadavg_at_end,
    });
    if let Some(l) = &r.lateness {
        lateness_rows(l, &mut rows);
    }
    if let Some(k) = &r.deadline_to_kafka {
        deadline_to_kafka_rows(k, &mut rows);
    }
    if let Some(f) = &r.sustained {
        sustained_rows(f, &mut rows);
    }
    if let Some(s) = &r.statements {
        statements_rows(s, &mut rows);
    }
    if let Some(k) = &r.kafka_tls {
        kafka_tls_rows(k, &mut rows);
    }
    if let Some(d) = &r.drain {
        drain_rows(d, &mut rows);
    }
    if let Some(replay) = &r.replay {
        replay_rows(replay, &mut rows);
    }
    if let Some(m) = &r.migrations {
        migrations_rows(m, &mut rows);
    }
    if let Some(l) = &r.late_arrivals {
        late_arrivals_rows(l, &mut rows);
    }

    let mut out = String::new();
    out.push_str("| figure | project (min / median / max) | baseline (min / median / max) | ratio (median) | goal | met | load 1/5/15 |\n");
    out.push_str("|---|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.figure,
            r.project,
            r.baseline,
            r.ratio,
            r.goal,
            r.met,
            load(&r.load)
        );
    }
    out
}

/// Figure 13: each selection against the same from a small trail (or a
/// smaller selection), and without the replay's indexes.
fn replay_rows(f: &ReplayFigure, rows: &mut Vec<Row>) {
    for row in &f.rows {
        let goal = (row.expected_ratio == Some(1.0)).then_some(REPLAY_RATIO_GOAL);
        rows.push(Row {
            // Sub-rows (indented labels) belong to the row above.
            figure: match row.label.strip_prefix("  ") {
                Some(sub) => format!("  {sub}"),
                None => format!("republish --dry-run: {}, batch {}", row.label, f.batch),
            },
            project: fixed(&row.ms, 0, "ms"),
            baseline: format!(
                "{}: {}",
                row.baseline_label,
                fixed(&row.baseline_ms, 0, "ms")
            ),
            ratio: format!("{:.2}x", row.ratio),
            goal: match goal {
                Some(g) => format!("<= {g}x (time follows the selection)"),
                None => row.expected_ratio.map_or("-".into(), |r| {
                    format!("about {r:.0}x (ten times the records)")
                }),
            },
            met: goal.map_or("-".into(), |g| met(row.ratio <= g)),
            load: f.loadavg_at_start,
        });
    }
}

/// Figure 14: how long each migration held the worker's writes.
fn migrations_rows(f: &MigrationsFigure, rows: &mut Vec<Row>) {
    for size in &f.sizes {
        for m in &size.migrations {
            rows.push(Row {
                figure: format!(
                    "migration {} ({}) on a 24 h outbox of {} rows: longest expiry write during it",
                    m.version,
                    m.what,
                    num(size.outbox_rows as f64)
                ),
                project: fixed(&m.longest_write_ms, 0, "ms"),
                baseline: format!("write median {}", fixed(&size.write_median_ms, 1, "ms")),
                ratio: format!(
                    "{:.0}x",
                    m.longest_write_ms.median / size.write_median_ms.median
                ),
                goal: format!(
                    "migration {} < {:.0} s statement timeout",
                    fixed(&m.ms, 0, "ms"),
                    f.statement_timeout_s
                ),
                met: met(m.ms.max < f.statement_timeout_s * 1e3),
                load: f.loadavg_at_start,
            });
        }
    }
}

/// Figure 15: lateness of bookings written while the worker sleeps, and
/// statements per minute with those writes and idle.
fn late_arrivals_rows(l: &LateArrivals, rows: &mut Vec<Row>) {
    let (d, f) = (&l.deadline_driven, &l.fixed);
    let none_early = d.at_or_before_deadline == 0 && d.pending == 0;
    for (label, dv, fv, goal) in [
        ("p50", d.p50_s, f.p50_s, None),
        ("p99", d.p99_s, f.p99_s, Some(LATENESS_P99_GOAL_S)),
        ("max", d.max_s, f.max_s, Some(LATENESS_P99_GOAL_S)),
    ] {
        rows.push(Row {
            figure: format!(
                "late arrivals: lateness {label}, {} bookings written while the worker sleeps, each due {:.0}-{:.0} s after its insert, binary `run`, defaults",
                l.written, l.lead_s[0], l.lead_s[1]
            ),
            project: format!("deadline-driven {}", secs3(dv)),
            baseline: format!("fixed {}", secs3(fv)),
            ratio: format!("{:.3}x", dv / fv),
            goal: goal.map_or("-".into(), |g| {
                format!("<= {g} s, none at or before its deadline, none left")
            }),
            met: goal.map_or("-".into(), |g| met(dv <= g && none_early)),
            load: l.loadavg_at_start,
        });
    }
    for writes in [true, false] {
        let of = |mode: Mode| {
            l.statements
                .iter()
                .find(|r| r.mode == mode && (r.expired_in_window > 0) == writes)
        };
        let (Some(dr), Some(fr)) = (of(Mode::DeadlineDriven), of(Mode::Fixed)) else {
            continue;
        };
        rows.push(Row {
            figure: format!(
                "statements/min against PostgreSQL, 1 instance, {}",
                if writes {
                    "with those bookings"
                } else {
                    "idle (no booking)"
                }
            ),
            project: format!("deadline-driven {}/min", num(dr.per_minute)),
            baseline: format!("fixed {}/min", num(fr.per_minute)),
            ratio: format!("{:.1}x", dr.per_minute / fr.per_minute),
            goal: "-".into(),
            met: "-".into(),
            load: l.loadavg_at_start,
        });
    }
}

/// Figure 19: each backlog's drain against the smallest one's.
fn drain_rows(d: &crate::figures::drain::DrainFigure, rows: &mut Vec<Row>) {
    let Some(base) = d.sizes.first() else { return };
    for size in &d.sizes {
        let goal = match size.rows {
            r if r >= 2_000_000 => Some(0.8),
            r if r > base.rows => Some(0.9),
            _ => None,
        };
        let ratio = size.events_per_s.median / base.events_per_s.median;
        rows.push(Row {
            figure: format!(
                "drain an outbox backlog of {} rows (run --no-worker) vs {} rows",
                num(size.rows as f64),
                num(base.rows as f64)
            ),
            project: rates(&size.events_per_s, "events/s"),
            baseline: rates(&base.events_per_s, "events/s"),
            ratio: format!("{ratio:.2}x"),
            goal: goal.map_or("-".into(), |g| format!(">= {g}x")),
            met: goal.map_or("-".into(), |g| met(ratio >= g)),
            load: d.loadavg_at_start,
        });
        let cpu = size.pg_cpu_ms_per_1000.median / base.pg_cpu_ms_per_1000.median;
        rows.push(Row {
            figure: format!(
                "  PostgreSQL CPU per 1,000 events at {} rows vs {} (WAL {} bytes per event)",
                num(size.rows as f64),
                num(base.rows as f64),
                num(size.wal_bytes_per_event.median)
            ),
            project: fixed(&size.pg_cpu_ms_per_1000, 1, "ms"),
            baseline: fixed(&base.pg_cpu_ms_per_1000, 1, "ms"),
            ratio: format!("{cpu:.2}x"),
            goal: if size.rows > base.rows {
                "<= 1.2x".into()
            } else {
                "-".into()
            },
            met: if size.rows > base.rows {
                met(cpu <= 1.2)
            } else {
                "-".into()
            },
            load: d.loadavg_at_start,
        });
    }
}

fn kafka_tls_rows(k: &crate::figures::kafka_tls::KafkaTlsFigure, rows: &mut Vec<Row>) {
    rows.push(Row {
        figure: format!(
            "Kafka produce over SASL_SSL (SCRAM-SHA-512) vs PLAINTEXT, KafkaTransport, {} records in batches of {} split by partition",
            k.records, k.batch
        ),
        project: rates(&k.sasl_ssl_records_per_s, "records/s"),
        baseline: rates(&k.plaintext_records_per_s, "records/s"),
        ratio: format!("{:.2}x", k.ratio),
        goal: "-".into(),
        met: "-".into(),
        load: k.loadavg_at_start,
    });
    for (label, stat) in [("SSL", &k.setup_ssl_ms), ("SASL_SSL", &k.setup_sasl_ssl_ms)] {
        rows.push(Row {
            figure: format!(
                "  connection set-up over {label} vs PLAINTEXT (fresh sink: bootstrap, metadata, leader)"
            ),
            project: fixed(stat, 1, "ms"),
            baseline: fixed(&k.setup_plaintext_ms, 1, "ms"),
            ratio: format!("{:.2}x", stat.median / k.setup_plaintext_ms.median),
            goal: "-".into(),
            met: "-".into(),
            load: k.loadavg_at_start,
        });
    }
}

/// Figure 10: the worker against the raw statement on the lean schema,
/// and the two raw baselines against each other.
fn lean_rows(l: &LeanFigure, rows: &mut Vec<Row>) {
    let row =
        |figure: String, project: String, baseline: String, ratio: f64, goal: Option<f64>| Row {
            figure,
            project,
            baseline,
            ratio: format!("{ratio:.2}x"),
            goal: goal.map_or("-".into(), |g| format!(">= {g}x")),
            met: goal.map_or("-".into(), |g| met(ratio >= g)),
            load: l.loadavg_at_start,
        };
    rows.push(row(
        format!("{}: worker vs raw SQL on a lean schema", l.label),
        rates(&l.worker_bookings_per_s, "bookings/s"),
        format!("lean {}", rates(&l.raw_lean_bookings_per_s, "bookings/s")),
        l.worker_vs_raw_lean,
        Some(EXPIRY_GOAL),
    ));
    rows.push(row(
        "  same run: worker vs raw SQL on the own schema".into(),
        rates(&l.worker_bookings_per_s, "bookings/s"),
        format!("own {}", rates(&l.raw_own_bookings_per_s, "bookings/s")),
        l.worker_vs_raw_own,
        None,
    ));
    rows.push(row(
        "  same run: raw SQL on the own schema vs on the lean schema".into(),
        format!("own {}", rates(&l.raw_own_bookings_per_s, "bookings/s")),
        format!("lean {}", rates(&l.raw_lean_bookings_per_s, "bookings/s")),
        l.raw_own_vs_raw_lean,
        None,
    ));
}

/// Figure 11: one row per variant of the ablation.
pub fn schema_cost_table(c: &SchemaCost) -> String {
    let mut out = format!(
        "\n| schema variant ({} due / {} rows, batch {}, raw statement unless noted) | wall ms per 10k rows (min / median / max) | vs base | server CPU ms per 10k rows (min / median / max) | vs base | WAL bytes per booking (median) | headers bytes |\n|---|---|---|---|---|---|---|\n",
        c.due, c.table_rows, c.batch
    );
    for row in &c.rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2}x | {} | {:.2}x | {:.0} | {} |",
            row.change,
            fixed(&row.ms_per_10k, 0, "ms"),
            row.vs_base,
            fixed(&row.server_cpu_ms_per_10k, 0, "ms"),
            row.cpu_vs_base,
            row.wal_bytes_per_booking.median,
            row.headers_bytes.map_or("-".into(), |b| format!("{b:.0}"))
        );
    }
    out
}

fn publisher_rows(p: &PublisherFigure, rows: &mut Vec<Row>) {
    rows.push(Row {
        figure: format!(
            "publisher {} rows, batch {}, events/s vs DB-only (the same pipeline, a broker that acks at once)",
            p.rows, p.batch
        ),
        project: rates(&p.kafka_events_per_s, "events/s"),
        baseline: rates(&p.db_only_rows_per_s, "rows/s"),
        ratio: match &p.ratio_per_rep {
            Some(r) => format!("{:.2}x (per repetition {:.2}-{:.2}x)", p.ratio, r.min, r.max),
            None => format!("{:.2}x", p.ratio),
        },
        goal: format!(">= {PUBLISHER_GOAL}x"),
        met: met(p.ratio >= PUBLISHER_GOAL),
        load: p.loadavg_at_start,
    });
    if let Some(scripted) = &p.scripted_rows_per_s {
        rows.push(Row {
            figure: "  profile: DB-only with ScriptedTransport (acks at once, keeps a copy of every record)".into(),
            project: rates(scripted, "rows/s"),
            baseline: rates(&p.db_only_rows_per_s, "rows/s"),
            ratio: format!("{:.2}x", scripted.median / p.db_only_rows_per_s.median),
            goal: "-".into(),
            met: "-".into(),
            load: p.loadavg_at_start,
        });
    }
    if let Some(raw) = &p.raw_rounds_rows_per_s {
        rows.push(Row {
            figure: "  profile: DB-only vs the rounds' statements back to back (mark + lease claim per transaction, no pipeline)".into(),
            project: rates(&p.db_only_rows_per_s, "rows/s"),
            baseline: rates(raw, "rows/s"),
            ratio: format!("{:.2}x", p.db_only_rows_per_s.median / raw.median),
            goal: "-".into(),
            met: "-".into(),
            load: p.loadavg_at_start,
        });
    }
    rows.push(Row {
        figure: format!(
            "  profile: Kafka-only produce (KafkaTransport, {} per request, no DB) vs serial DB+Kafka model",
            p.batch
        ),
        project: rates(&p.kafka_only_records_per_s, "records/s"),
        baseline: format!("model {} events/s", num(p.serial_model_events_per_s)),
        ratio: format!(
            "publisher {:.2}x of model",
            p.kafka_events_per_s.median / p.serial_model_events_per_s
        ),
        goal: "-".into(),
        met: format!(
            "produce requests in flight {:.0}% of publisher time (summed over partitions)",
            p.produce_share_of_publisher_time.median * 100.0
        ),
        load: p.loadavg_at_start,
    });
    rows.push(Row {
        figure: "  profile: 2 publisher instances in parallel on one outbox".into(),
        project: rates(&p.two_instances_events_per_s, "events/s"),
        baseline: rates(&p.db_only_rows_per_s, "rows/s"),
        ratio: format!(
            "{:.2}x",
            p.two_instances_events_per_s.median / p.db_only_rows_per_s.median
        ),
        goal: "-".into(),
        met: "-".into(),
        load: p.loadavg_at_start,
    });
}

/// "median (min-max)" of a per-repetition ratio.
fn ratio_spread(r: &Stat) -> String {
    format!("{:.2}x ({:.2}-{:.2}x)", r.median, r.min, r.max)
}

/// Figure 17: after over before, publisher alone and the whole event.
fn outbox_cost_rows(c: &OutboxCost, rows: &mut Vec<Row>) {
    let (Some(before), Some(after)) = (c.side("before"), c.side("after")) else {
        return;
    };
    let mut cases = vec![
        (
            "CPU per event, publisher alone",
            after.publish_cpu_us.clone(),
            before.publish_cpu_us.clone(),
            "µs",
        ),
        (
            "WAL per event, publisher alone",
            after.publish_wal_bytes.clone(),
            before.publish_wal_bytes.clone(),
            "B",
        ),
        (
            "CPU per event, whole event (expire + publish)",
            after.event_cpu_us(),
            before.event_cpu_us(),
            "µs",
        ),
        (
            "WAL per event, whole event (expire + publish)",
            after.event_wal_bytes(),
            before.event_wal_bytes(),
            "B",
        ),
    ];
    // `run`'s path: the expiry hands its rows over leased; its expiry and
    // publishing overlap, so only the whole event compares.
    if let Some(handoff) = c.side("handoff") {
        cases.push((
            "CPU per event, whole event, run's path (rows handed over leased)",
            handoff.event_cpu_us(),
            before.event_cpu_us(),
            "µs",
        ));
        cases.push((
            "WAL per event, whole event, run's path (rows handed over leased)",
            handoff.event_wal_bytes(),
            before.event_wal_bytes(),
            "B",
        ));
    }
    for (i, (label, a, b, unit)) in cases.into_iter().enumerate() {
        let decimals = if unit == "B" { 0 } else { 1 };
        let ratio = outbox_cost::paired_ratio(&a, &b);
        rows.push(Row {
            figure: if i == 0 {
                format!(
                    "PostgreSQL {label}: after (the pipeline on PgStore, broker acks at once) vs before (claim FOR UPDATE + mark per batch), {} events, batch {}",
                    num(c.events as f64),
                    c.publish_batch
                )
            } else {
                format!("  PostgreSQL {label}")
            },
            project: format!("after {}", fixed(&a, decimals, unit)),
            baseline: format!("before {}", fixed(&b, decimals, unit)),
            ratio: ratio_spread(&ratio),
            goal: format!("<= {PG_WORK_GOAL}x"),
            met: met(ratio.median <= PG_WORK_GOAL),
            load: c.loadavg_at_start,
        });
    }
}

/// Figure 18: per instance count, the highest rate kept up and the knee.
fn sustained_rows(f: &Sustained, rows: &mut Vec<Row>) {
    for c in &f.configs {
        let knee = sustained::knee(c);
        let kept: Option<&sustained::Step> = c
            .steps
            .iter()
            .take_while(|s| knee.is_none_or(|k| s.rate < k.rate))
            .last();
        rows.push(Row {
            figure: format!(
                "sustained rate, {} instance{} of `run` at its defaults, {:.0} s steps of {}/s: highest rate kept up (its commit lateness p99) and the knee",
                c.instances,
                if c.instances == 1 { "" } else { "s" },
                f.step_s,
                f.rates
                    .iter()
                    .map(|r| num(*r))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            project: kept.map_or("none".into(), |s| {
                format!("{}/s (p99 {:.2} s)", num(s.rate), s.commit_p99_s)
            }),
            baseline: "-".into(),
            ratio: "-".into(),
            goal: "-".into(),
            met: knee.map_or("no knee up to the last step".into(), |k| {
                format!(
                    "knee at {}/s (p99 {:.2} s, PostgreSQL {:.2} cores, machine {:.2})",
                    num(k.rate),
                    k.commit_p99_s,
                    k.pg_cores,
                    k.machine_busy_cores
                )
            }),
            load: f.loadavg_at_start,
        });
    }
}

fn end_to_end_rows(e: &EndToEnd, rows: &mut Vec<Row>) {
    let plain = |figure: String, project: String, goal: Option<(String, bool)>| Row {
        figure,
        project,
        baseline: "-".into(),
        ratio: "-".into(),
        goal: goal.as_ref().map_or("-".into(), |(g, _)| g.clone()),
        met: goal.map_or("-".into(), |(_, ok)| met(ok)),
        load: e.loadavg_at_start,
    };
    rows.push(plain(
        format!(
            "end to end: {} due -> all on Kafka (binary `run`, start included)",
            e.events
        ),
        fixed(&e.wall_s, 2, "s"),
        Some((
            format!("< {END_TO_END_GOAL_S} s (spec SLO)"),
            e.wall_s.max < END_TO_END_GOAL_S,
        )),
    ));
    rows.push(plain(
        "outbox write -> broker ack, p50".into(),
        fixed(&e.write_to_ack_p50_ms, 1, "ms"),
        None,
    ));
    rows.push(plain(
        "outbox write -> broker ack, p99".into(),
        fixed(&e.write_to_ack_p99_ms, 1, "ms"),
        Some((
            format!(
                "< {} s poll interval (wake-up on commit)",
                P99_GOAL_MS / 1e3
            ),
            e.write_to_ack_p99_ms.max < P99_GOAL_MS,
        )),
    ));
    rows.push(plain(
        "peak RSS (VmHWM) of the binary during end to end".into(),
        fixed(&e.peak_rss_mib, 1, "MiB"),
        Some((
            format!("< {RSS_GOAL_MIB} MiB"),
            e.peak_rss_mib.max < RSS_GOAL_MIB,
        )),
    ));
}

/// Figure 16: the default logging, text and JSON, against `RUST_LOG=warn`.
fn logging_rows(f: &LoggingFigure, rows: &mut Vec<Row>) {
    for (format, runs) in [("text", &f.text), ("LOG_FORMAT=json", &f.json)] {
        rows.push(Row {
            figure: format!(
                "logging at the default level, {format}: `once` over {} due of {} tenants, log to a file \
                 ({:.0} B per booking, longest line {} B) vs `RUST_LOG=warn`",
                f.due,
                f.tenants,
                f.bytes_per_booking(runs),
                runs.longest_line
            ),
            project: fixed(&LoggingFigure::cycle(runs), 0, "ms"),
            baseline: fixed(&LoggingFigure::cycle(&f.warn), 0, "ms"),
            ratio: format!("{:.2}x", f.ratio(runs)),
            goal: format!(
                "<= {}x, <= {:.0} B per booking, lines <= {} B",
                logging::RATIO_GOAL,
                logging::BYTES_PER_BOOKING_GOAL,
                logging::LONGEST_LINE_GOAL
            ),
            met: met(f.met(runs)),
            load: f.loadavg_at_start,
        });
    }
}

fn secs3(v: f64) -> String {
    format!("{v:.3} s")
}

/// Figure 7: the same spread of deadlines, both modes at the same time.
fn lateness_rows(l: &Lateness, rows: &mut Vec<Row>) {
    let (d, f) = (&l.deadline_driven, &l.fixed);
    let what = format!(
        "{} deadlines over {:.0} s, interval {:.0} s, binary `run`",
        num(l.load.bookings as f64),
        l.load.spread_s,
        l.interval_s
    );
    let row = |figure: String, project: f64, baseline: f64, goal: Option<(String, bool)>| Row {
        figure,
        project: format!("deadline-driven {}", secs3(project)),
        baseline: format!("fixed {}", secs3(baseline)),
        ratio: format!("{:.3}x", project / baseline),
        goal: goal.as_ref().map_or("-".into(), |(g, _)| g.clone()),
        met: goal.map_or("-".into(), |(_, ok)| met(ok)),
        load: l.loadavg_at_start,
    };
    rows.push(row(
        format!("lateness (expired_at - deadline) p50, {what}"),
        d.p50_s,
        f.p50_s,
        None,
    ));
    rows.push(row(
        "lateness p99".into(),
        d.p99_s,
        f.p99_s,
        Some((
            format!("<= {LATENESS_P99_GOAL_S} s, none at or before its deadline, none left"),
            d.p99_s <= LATENESS_P99_GOAL_S
                && d.at_or_before_deadline == 0
                && d.pending == 0
                && f.at_or_before_deadline == 0,
        )),
    ));
    rows.push(row("lateness max".into(), d.max_s, f.max_s, None));
}

/// Figure 8: deadline to the record's timestamp on the topic.
fn deadline_to_kafka_rows(k: &DeadlineToKafka, rows: &mut Vec<Row>) {
    let row = |figure: String, record: f64, expiry: f64, goal: Option<(String, bool)>| Row {
        figure,
        project: secs3(record),
        baseline: format!("expiry alone {}", secs3(expiry)),
        ratio: "-".into(),
        goal: goal.as_ref().map_or("-".into(), |(g, _)| g.clone()),
        met: goal.map_or("-".into(), |(_, ok)| met(ok)),
        load: k.loadavg_at_start,
    };
    rows.push(row(
        format!(
            "deadline -> record on Kafka p50, {} deadlines over {:.0} s, binary `run`, defaults",
            num(k.load.bookings as f64),
            k.load.spread_s
        ),
        k.record_p50_s,
        k.expired_p50_s,
        None,
    ));
    rows.push(row(
        "deadline -> record on Kafka p99".into(),
        k.record_p99_s,
        k.expired_p99_s,
        Some((
            format!("<= {KAFKA_P99_GOAL_S} s (1 s expiry + about 1 s)"),
            k.record_p99_s <= KAFKA_P99_GOAL_S && k.records == k.load.bookings,
        )),
    ));
}

/// Figure 9: statements per minute, deadline-driven over fixed.
fn statements_rows(s: &Statements, rows: &mut Vec<Row>) {
    for instances in [1, 4] {
        let of = |mode: Mode| {
            s.runs
                .iter()
                .find(|r| r.mode == mode && r.instances == instances)
        };
        let (Some(d), Some(f)) = (of(Mode::DeadlineDriven), of(Mode::Fixed)) else {
            continue;
        };
        rows.push(Row {
            figure: format!(
                "statements/min against PostgreSQL, {instances} instance{}, {} deadlines over {:.0} s",
                if instances == 1 { "" } else { "s" },
                num(s.load.bookings as f64),
                s.load.spread_s
            ),
            project: format!("deadline-driven {}/min", num(d.per_minute)),
            baseline: format!("fixed {}/min", num(f.per_minute)),
            ratio: if f.per_minute > 0.0 {
                format!("{:.1}x", d.per_minute / f.per_minute)
            } else {
                "n/a".into()
            },
            goal: "-".into(),
            met: "-".into(),
            load: s.loadavg_at_start,
        });
    }
}

fn load(l: &[f64; 3]) -> String {
    format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2])
}

fn samples(s: &Stat, decimals: usize) -> String {
    s.samples
        .iter()
        .map(|v| format!("{v:.decimals$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every sample of every figure, the profile pass, the binary and the run.
pub fn raw_numbers(r: &Results) -> String {
    let mut out = String::from("### Raw numbers of this run\n\n");
    out.push_str("| measurement | due | table rows | batch | inst. | worker seconds per run | raw-SQL seconds per run |\n");
    out.push_str("|---|---|---|---|---|---|---|\n");
    for (key, c) in comparisons(r) {
        let _ = writeln!(
            out,
            "| `{key}` | {} | {} | {} | {} | {} | {} |",
            c.due,
            c.table_rows,
            c.batch,
            c.instances,
            samples(&c.worker_seconds, 3),
            samples(&c.raw_sql_seconds, 3)
        );
    }
    if let Some(lean) = &r.lean {
        let _ = writeln!(
            out,
            "\nWorker vs raw SQL on the own and on a lean schema, bookings/s per repetition: worker {}; raw own {}; raw lean {}. \
             PostgreSQL CPU ms per 10k bookings (min / median / max): worker {}, raw own {}, raw lean {}; \
             WAL bytes per booking (median): worker {:.0}, raw own {:.0}, raw lean {:.0}.",
            samples(&lean.worker_bookings_per_s, 0),
            samples(&lean.raw_own_bookings_per_s, 0),
            samples(&lean.raw_lean_bookings_per_s, 0),
            fixed(&lean.server_cpu_ms_per_10k[0], 0, "ms"),
            fixed(&lean.server_cpu_ms_per_10k[1], 0, "ms"),
            fixed(&lean.server_cpu_ms_per_10k[2], 0, "ms"),
            lean.wal_bytes_per_booking[0].median,
            lean.wal_bytes_per_booking[1].median,
            lean.wal_bytes_per_booking[2].median
        );
    }
    if let Some(cost) = &r.schema_cost {
        out.push_str(&schema_cost_table(cost));
    }
    if let Some(idle) = &r.idle_cycle {
        let _ = writeln!(
            out,
            "\nIdle cycle over {} bookings, {} cycles (ms): {}",
            idle.table_rows,
            idle.ms.samples.len(),
            samples(&idle.ms, 2)
        );
    }
    if let Some(p) = &r.publisher {
        publisher_raw(p, &mut out);
    }
    if let Some(c) = &r.outbox_cost {
        out.push_str(&outbox_cost_tables(c));
    }
    if let Some(e) = &r.end_to_end {
        end_to_end_raw(e, &mut out);
    }
    if let Some(runs) = &r.profile_pg_stat_statements {
        profile_raw(runs, &mut out);
    }
    deadline_wake_raw(r, &mut out);
    if let Some(f) = &r.sustained {
        out.push_str(&sustained_table(f));
    }
    if let Some(m) = &r.migrations {
        migrations_raw(m, &mut out);
    }
    if let Some(f) = &r.replay {
        let _ = writeln!(
            out,
            "\nReplay: the large trail ({} records, and a booking each) seeded in {:.0} s; the replay's indexes built CONCURRENTLY on it in {}; ms per replay: {}.",
            num(f.records as f64),
            f.seed_s,
            f.index_builds
                .iter()
                .map(|b| format!("{:.1} s ({})", b.s, b.index))
                .collect::<Vec<_>>()
                .join(", "),
            f.rows
                .iter()
                .map(|r| format!(
                    "{} [{}] vs [{}]",
                    r.label.trim(),
                    samples(&r.ms, 0),
                    samples(&r.baseline_ms, 0)
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    let _ = writeln!(
        out,
        "\nBinary: {} bytes. Run took {:.0} s; load average at start {}, at end {}.",
        r.binary.bytes,
        r.duration_s,
        load(&r.machine.loadavg_at_start),
        load(&r.machine.loadavg_at_end)
    );
    out
}

fn migrations_raw(m: &MigrationsFigure, out: &mut String) {
    out.push_str(
        "\n| migration | outbox rows | duration ms per repetition | longest expiry write during it, ms | write median before, ms |\n|---|---|---|---|---|\n",
    );
    for size in &m.sizes {
        for t in &size.migrations {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                t.version,
                num(size.outbox_rows as f64),
                samples(&t.ms, 0),
                samples(&t.longest_write_ms, 0),
                samples(&size.write_median_ms, 1)
            );
        }
    }
}

fn publisher_raw(p: &PublisherFigure, out: &mut String) {
    out.push_str("\n| publisher run | per repetition |\n|---|---|\n");
    let mut lines: Vec<(&str, &Stat, usize)> = vec![
        (
            "project publisher (pipeline to Kafka), events/s",
            &p.kafka_events_per_s,
            0,
        ),
        (
            "DB-only: the pipeline, a broker that acks at once and keeps nothing, rows/s",
            &p.db_only_rows_per_s,
            0,
        ),
    ];
    if let Some(r) = &p.ratio_per_rep {
        lines.push(("publisher / DB-only", r, 2));
    }
    if let Some(s) = &p.scripted_rows_per_s {
        lines.push(("the pipeline with ScriptedTransport, rows/s", s, 0));
    }
    if let Some(s) = &p.raw_rounds_rows_per_s {
        lines.push((
            "the rounds' statements back to back (no pipeline), rows/s",
            s,
            0,
        ));
    }
    lines.extend([
        (
            "Kafka-only produce, records/s",
            &p.kafka_only_records_per_s,
            0,
        ),
        (
            "produce requests in flight over publisher time (summed over partitions)",
            &p.produce_share_of_publisher_time,
            2,
        ),
        (
            "2 publisher instances, events/s",
            &p.two_instances_events_per_s,
            0,
        ),
    ]);
    for (label, stat, decimals) in lines {
        let _ = writeln!(out, "| {label} | {} |", samples(stat, decimals));
    }
    if let Some([kafka, db_only]) = p.rounds {
        let _ = writeln!(
            out,
            "\nDatabase rounds (transactions) per run of {} rows, first repetition: {kafka} with Kafka, {db_only} DB-only.",
            p.rows
        );
    }
}

/// Figure 17 in full: every side's steps, then after over before.
pub fn outbox_cost_tables(c: &OutboxCost) -> String {
    let mut out = format!(
        "\nPostgreSQL work per event ({} events per run, expiry batch {}, publisher batch {}; CPU: every PostgreSQL process, µs per event, min / median / max; WAL: bytes per event, median):\n\n\
         | side | fillfactor | expiry CPU | expiry WAL | publisher CPU | publisher WAL | VACUUM of the outbox CPU | its WAL | publisher s | outbox updates per event (HOT) | outbox pages |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
        num(c.events as f64),
        c.expiry_batch,
        c.publish_batch
    );
    let us = |v: f64| format!("{v:.1}");
    for s in &c.sides {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} | {:.0} | {} | {:.0} | {} | {:.2} ({:.0}% HOT) | {:.0} |",
            s.label,
            s.fillfactor,
            s.expiry_cpu_us.show(us),
            s.expiry_wal_bytes.median,
            s.publish_cpu_us.show(us),
            s.publish_wal_bytes.median,
            s.vacuum_cpu_us.show(us),
            s.vacuum_wal_bytes.median,
            s.publish_s.show(|v| format!("{v:.2}")),
            s.outbox_updates_per_event,
            s.outbox_hot_share * 100.0,
            s.outbox_pages
        );
    }
    if let Some(split) = c.side("split")
        && let (Some(cpu), Some(wal)) = (&split.lease_cpu_us, &split.lease_wal_bytes)
    {
        let mark_cpu = Stat::of(
            &split
                .publish_cpu_us
                .samples
                .iter()
                .zip(&cpu.samples)
                .map(|(t, l)| t - l)
                .collect::<Vec<_>>(),
        );
        let mark_wal = Stat::of(
            &split
                .publish_wal_bytes
                .samples
                .iter()
                .zip(&wal.samples)
                .map(|(t, l)| t - l)
                .collect::<Vec<_>>(),
        );
        let _ = writeln!(
            out,
            "\nBreakdown (`split`: every lease claim, then every mark): the claims with their leases {} µs and {:.0} B per event, the marks {} µs and {:.0} B per event.",
            cpu.show(us),
            wal.median,
            mark_cpu.show(us),
            mark_wal.median
        );
    }
    let Some(before) = c.side("before") else {
        return out;
    };
    out.push_str(
        "\n| after / before, per repetition: median (min-max) | publisher CPU | publisher WAL | whole event CPU | whole event WAL | publisher + VACUUM CPU | publisher + VACUUM WAL | whole event + VACUUM CPU | whole event + VACUUM WAL |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for s in c.sides.iter().filter(|s| s.key != "before") {
        let r = |a: Stat, b: Stat| ratio_spread(&outbox_cost::paired_ratio(&a, &b));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.label,
            r(s.publish_cpu_us.clone(), before.publish_cpu_us.clone()),
            r(
                s.publish_wal_bytes.clone(),
                before.publish_wal_bytes.clone()
            ),
            r(s.event_cpu_us(), before.event_cpu_us()),
            r(s.event_wal_bytes(), before.event_wal_bytes()),
            r(s.publish_vacuum_cpu_us(), before.publish_vacuum_cpu_us()),
            r(
                s.publish_vacuum_wal_bytes(),
                before.publish_vacuum_wal_bytes()
            ),
            r(s.event_vacuum_cpu_us(), before.event_vacuum_cpu_us()),
            r(s.event_vacuum_wal_bytes(), before.event_vacuum_wal_bytes()),
        );
    }
    let _ = writeln!(
        out,
        "\nBefore, as the bench runs it: `{}` then `{}`, one transaction per batch. Load average {} at the start, {} at the end.",
        c.before_claim_sql,
        c.before_mark_sql,
        load(&c.loadavg_at_start),
        load(&c.loadavg_at_end)
    );
    out
}

/// Figure 18 in full: one row per step, both instance counts.
pub fn sustained_table(f: &Sustained) -> String {
    let mut out = format!(
        "\nSustained rate ({:.0} s of deadlines per step, binary `run` at its defaults; took {:.0} s, load average {} at the start, {} at the end):\n\n\
         | instances | rate /s | bookings | commit − deadline p50 / p99 / max s | expired_at − deadline p99 s | acked on Kafka − deadline p50 / p99 s | most due rows | most unpublished rows | all expired / published after the last deadline, s | left active / unpublished | CPU ms per 1,000 events: instances / PostgreSQL / Kafka | WAL MB per 1,000 events | cores: instances / PostgreSQL / Kafka / machine (others) | autovacuum runs | log B per event | load at start |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        f.step_s,
        f.duration_s,
        load(&f.loadavg_at_start),
        load(&f.loadavg_at_end)
    );
    let mut steps: Vec<(u32, &sustained::Step)> = f
        .configs
        .iter()
        .flat_map(|c| c.steps.iter().map(move |s| (c.instances, s)))
        .collect();
    steps.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.rate.total_cmp(&b.1.rate)));
    for (instances, s) in steps {
        let _ = writeln!(
            out,
            "| {instances} | {} | {} | {:.3} / {:.3} / {:.3} | {:.3} | {:.3} / {:.3} | {} | {} | {:.1} / {:.1} | {} / {} | {:.0} / {:.0} / {:.0} | {:.2} | {:.2} / {:.2} / {:.2} / {:.2} ({:.2}) | {} | {:.0} | {:.2} |",
            num(s.rate),
            num(s.bookings as f64),
            s.commit_p50_s,
            s.commit_p99_s,
            s.commit_max_s,
            s.expired_at_p99_s,
            s.acked_p50_s,
            s.acked_p99_s,
            num(s.max_due as f64),
            num(s.max_unpublished as f64),
            s.expired_after_last_deadline_s,
            s.published_after_last_deadline_s,
            s.left_active,
            s.left_unpublished,
            s.worker_cpu_ms_per_1000,
            s.pg_cpu_ms_per_1000,
            s.kafka_cpu_ms_per_1000,
            s.wal_bytes_per_1000 / 1e6,
            s.worker_cores,
            s.pg_cores,
            s.kafka_cores,
            s.machine_busy_cores,
            s.others_cores,
            s.autovacuum_runs,
            s.log_bytes_per_event,
            s.loadavg_at_start[0]
        );
    }
    for c in &f.configs {
        let _ = writeln!(
            out,
            "\n{} instance{}: {}.",
            c.instances,
            if c.instances == 1 { "" } else { "s" },
            match sustained::knee(c) {
                Some(k) => format!(
                    "the knee at {}/s: commit lateness p99 {:.3} s against a floor of {:.3} s, all published {:.1} s after the last deadline, {} left",
                    num(k.rate),
                    k.commit_p99_s,
                    c.steps
                        .iter()
                        .map(|s| s.commit_p99_s)
                        .fold(f64::INFINITY, f64::min),
                    k.published_after_last_deadline_s,
                    k.left_active + k.left_unpublished
                ),
                None => "every step kept up (no knee)".into(),
            }
        );
    }
    out
}

fn end_to_end_raw(e: &EndToEnd, out: &mut String) {
    out.push_str(
        "\n| end-to-end run | wall s | first outbox write after start s | expiry span s \
         | last ack after start s | p50 ms | p99 ms | max ms | VmHWM KiB | clean exit |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    for (i, run) in e.runs.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {:.1} | {:.1} | {} | {} |",
            i + 1,
            run.wall_s,
            run.first_write_after_start_s,
            run.expiry_span_s,
            run.last_ack_after_start_s,
            run.p50_ms,
            run.p99_ms,
            run.max_ms,
            run.peak_rss_kib,
            if run.clean_exit { "yes" } else { "no" }
        );
    }
}

fn profile_raw(runs: &[ProfileRun], out: &mut String) {
    out.push_str(
        "\n| profile run (pg_stat_statements on) | rows | transactions | statements / transaction \
         | wall ms | server exec+plan ms | wall − server ms | client CPU ms | WAL records / booking |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for run in runs {
        let _ = writeln!(
            out,
            "| {} batch {} | {} | {} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} |",
            run.side,
            run.batch,
            run.rows,
            run.transactions,
            run.statements_per_transaction,
            run.wall_ms,
            run.server_ms,
            run.client_and_network_ms,
            run.client_cpu_ms,
            run.wal_records_per_booking
        );
    }
}

/// Figures 7 to 9 in detail.
fn deadline_wake_raw(r: &Results, out: &mut String) {
    if let Some(l) = &r.lateness {
        out.push_str(
            "\n| lateness run | bookings | expired | at or before deadline | left | p50 s | p99 s | max s \
             | all expired after the last deadline, s | clean exit |\n|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for side in [&l.deadline_driven, &l.fixed] {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.1} | {} |",
                side.mode.label(),
                l.load.bookings,
                side.expired,
                side.at_or_before_deadline,
                side.pending,
                side.p50_s,
                side.p99_s,
                side.max_s,
                side.done_after_last_deadline_s,
                if side.clean_exit { "yes" } else { "no" }
            );
        }
    }
    if let Some(k) = &r.deadline_to_kafka {
        let _ = writeln!(
            out,
            "\nDeadline -> Kafka: {} records of {} bookings; deadline -> record timestamp p50 {:.3} s, \
             p99 {:.3} s, max {:.3} s; deadline -> expired_at p50 {:.3} s, p99 {:.3} s; \
             deadline -> broker ack (published_at) p50 {:.3} s, p99 {:.3} s; clean exit {}.",
            k.records,
            k.load.bookings,
            k.record_p50_s,
            k.record_p99_s,
            k.record_max_s,
            k.expired_p50_s,
            k.expired_p99_s,
            k.acked_p50_s,
            k.acked_p99_s,
            if k.clean_exit { "yes" } else { "no" }
        );
    }
    if let Some(s) = &r.statements {
        out.push_str(
            "\n| statements run | instances | statements | window s | per minute | expired in window | top statements (calls) |\n\
             |---|---|---|---|---|---|---|\n",
        );
        for run in &s.runs {
            let top = run
                .top
                .iter()
                .take(4)
                .map(|(calls, query)| {
                    let short: String = query.chars().take(60).collect();
                    format!("{calls} `{}`", short.replace('|', "\\|"))
                })
                .collect::<Vec<_>>()
                .join("; ");
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.1} | {:.0} | {} of {} | {top} |",
                run.mode.label(),
                run.instances,
                run.statements,
                run.window_s,
                run.per_minute,
                run.expired_in_window,
                s.load.bookings
            );
        }
    }
}

/// The idle cycle's plans and what the first repetition of each expiry
/// figure wrote.
pub fn plans_and_details(r: &Results) -> String {
    let mut out = String::new();
    if let Some(idle) = &r.idle_cycle {
        out.push_str("### Plans of the idle cycle\n\n");
        for plan in &idle.plans {
            let _ = writeln!(
                out,
                "EXPLAIN (ANALYZE, BUFFERS) {} at as_of with 0 due over {} rows:\n\n```\n{}\n{}\n```\n",
                plan.name, idle.table_rows, plan.sql, plan.plan
            );
        }
    }
    out.push_str("### Details of the expiry figures (first repetition of each side)\n\n");
    for (_, c) in comparisons(r) {
        let details = serde_json::to_string(&c.details).unwrap_or_else(|e| e.to_string());
        let _ = writeln!(out, "- {}: `{details}`", c.label);
    }
    out
}
