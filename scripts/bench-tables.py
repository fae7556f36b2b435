#!/usr/bin/env python3
"""Markdown tables of one bench run, from its results.json (no number typed by hand).

    python3 scripts/bench-tables.py [docs/bench/results.json]

Prints the run's headline table (as the bench printed it), the raw samples of every
expiry figure, the idle cycles, the publisher runs, the end-to-end runs and the
profile pass, for docs/benchmarks.md.
"""

import json
import sys


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "docs/bench/results.json"
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    pg = d["postgresql"]
    m = d["machine"]
    print(f"Run finished {d['finished_at'][:19]}Z, {d['mode']} mode, {m['cores']} cores, "
          f"PostgreSQL {pg['server_version']}, fsync={pg['fsync']}, "
          f"synchronous_commit={pg['synchronous_commit']}, shared_buffers={pg['shared_buffers']}.\n")
    print(d["table_markdown"].rstrip() + "\n")

    print("### Raw numbers of this run\n")
    print("| measurement | due | table rows | batch | inst. | worker seconds per run | raw-SQL seconds per run |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted(d["expiry"]):
        e = d["expiry"][key]
        w = ", ".join(f"{s:.3f}" for s in e["worker_seconds"]["samples"])
        r = ", ".join(f"{s:.3f}" for s in e["raw_sql_seconds"]["samples"])
        print(f"| `{key}` | {e['due']} | {e['table_rows']} | {e['batch']} | {e['instances']} | {w} | {r} |")
    idle = d["idle_cycle"]
    print(f"\nIdle cycle over {idle['table_rows']} bookings, {len(idle['ms']['samples'])} cycles (ms): "
          + ", ".join(f"{s:.2f}" for s in idle["ms"]["samples"]) + "\n")

    p = d["publisher"]
    print("| publisher run | per repetition |")
    print("|---|---|")
    for label, key, fmt in [
        ("project publisher, events/s", "kafka_events_per_s", "{:.0f}"),
        ("DB-only claim + mark, rows/s", "db_only_rows_per_s", "{:.0f}"),
        ("Kafka-only produce, records/s", "kafka_only_records_per_s", "{:.0f}"),
        ("share of publisher time inside `produce` (summed over lanes)", "produce_share_of_publisher_time", "{:.2f}"),
        ("2 publisher instances, events/s", "two_instances_events_per_s", "{:.0f}"),
    ]:
        print(f"| {label} | " + ", ".join(fmt.format(s) for s in p[key]["samples"]) + " |")

    print("\n| end-to-end run | wall s | first outbox write after start s | expiry span s "
          "| last ack after start s | p50 ms | p99 ms | max ms | VmHWM KiB | clean exit |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(d["end_to_end"]["runs"], 1):
        print(f"| {i} | {r['wall_s']:.3f} | {r['first_write_after_start_s']:.3f} | {r['expiry_span_s']:.3f} "
              f"| {r['last_ack_after_start_s']:.3f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} "
              f"| {r['peak_rss_kib']} | {r['clean_exit']} |")

    print("\n| profile run (pg_stat_statements on) | rows | transactions | statements / transaction "
          "| wall ms | server exec+plan ms | wall − server ms | client CPU ms | WAL records / booking |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in d["profile_pg_stat_statements"]:
        print(f"| {r['side']} batch {r['batch']} | {r['rows']} | {r['transactions']} "
              f"| {r['statements_per_transaction']:.2f} | {r['wall_ms']:.0f} | {r['server_ms']:.0f} "
              f"| {r['client_and_network_ms']:.0f} | {r['client_cpu_ms']:.0f} | {r['wal_records_per_booking']:.1f} |")
    print(f"\nBinary: {d['binary']['bytes']} bytes. Run took {d['duration_s']:.0f} s; load average at start "
          f"{m['loadavg_at_start']}, at end {m['loadavg_at_end']}.")


if __name__ == "__main__":
    main()
