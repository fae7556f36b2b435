#!/usr/bin/env python3
"""Soak benchmark shaped like production; run it through scripts/soak.sh.

scripts/soak.sh starts PostgreSQL (default durability) and Kafka and builds the
release binary; this program then

1. creates the `crm` database and the worker's role `booking_expiration` with
   exactly the grants of deploy/postgres/grants.sql, runs `migrate` as the
   owner, and fills `bookings` with --rows rows across --tenants tenants (99%
   terminal, 1% active with deadlines days to weeks away);
2. runs --instances `booking-expiration run` at their default settings (only
   DATABASE_URL, KAFKA_BOOTSTRAP_SERVERS and a distinct METRICS_ADDR), stdout
   and stderr of each into its own log file;
3. inserts new active bookings at --rate per second (Poisson arrivals across
   the tenants, holds log-uniform --hold-min .. --hold-max, Reserve and
   Booking phase) through one long-running psql, and plays crm's managers
   through another (--manager-rate commands per second: extend a deadline,
   cancel, confirm, or book a reserved booking; each conditioned on the
   booking still being active, as crm does);
4. samples every --sample-seconds: per instance RSS and open fds, database
   connections, lateness (audit `at` - deadline) p50/p99/max of the bookings
   expired in the interval, statements per minute, outbox and audit rows,
   bytes and dead tuples, log bytes and WAL bytes per expired booking;
5. after --minutes stops the generators, lets the instances drain, stops them
   with SIGTERM, reads the topic once (scripts/kafka.sh consume), and checks
   that nothing was lost and the goals held;
6. writes samples.csv, summary.json and soak.svg to --out.

Python 3.11 standard library only; PostgreSQL through psql subprocesses.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOPIC = "pin.crm.booking-expired.v1"
WORKER_ROLE = "booking_expiration"
RESERVE_ACTIVE = ("Reserved", "AwaitingPayment")
BOOKING_ACTIVE = ("Booked",)
ACTIVE = RESERVE_ACTIVE + BOOKING_ACTIVE
# The deadline of the phase a row is in: what the worker compares with as_of.
PHASE_DEADLINE = (
    "CASE WHEN {b}.status IN ('Reserved','AwaitingPayment') THEN {b}.reserve_expires_at "
    "WHEN {b}.status = 'Booked' THEN {b}.booking_expires_at END"
)
# The deadline an expiry was measured against, from its audit record.
EXPIRED_DEADLINE = (
    "CASE a.to_status WHEN 'ReserveExpired' THEN b.reserve_expires_at ELSE b.booking_expires_at END"
)

# Active rows due more than a second ago, through the worker's two partial indexes.
DUE_BACKLOG = (
    "((SELECT count(*) FROM bookings WHERE status IN ('Reserved','AwaitingPayment') "
    "AND reserve_expires_at < now() - interval '1 second') + "
    "(SELECT count(*) FROM bookings WHERE status = 'Booked' "
    "AND booking_expires_at < now() - interval '1 second'))"
)

# Goals (docs/soak.md). Fixed here, not tuned to a run.
RSS_TOLERANCE = (0.05, 1024)  # last third's mean <= middle third's + max(5%, 1 MiB) (KiB)
FDS_TOLERANCE = (0.05, 2)  # last third's mean <= middle third's + max(5%, 2 fds)
LATENESS_P99_MS = 1000.0  # in every interval with expiries
OUTBOX_BACKLOG_MAX = 1000  # unpublished rows at every sample (spec §6 alert)
RETENTION_SWEEP_SLACK_S = 120  # the sweep runs every 60 s (src/outbox/maintenance.rs)
MIN_SAMPLES_FLAT = 6  # fewer cannot tell warm-up from growth
DUE_CUTOFF_S = 5  # "deadline passed more than a few seconds before the end"


def log(msg: str) -> None:
    print(f"soak.py: {msg}", file=sys.stderr, flush=True)


class Stop(Exception):
    """SIGINT / SIGTERM."""


def on_signal(signum, _frame):
    raise Stop(signal.Signals(signum).name)


# --- PostgreSQL through psql ------------------------------------------------------------


def url_with(url: str, user: str | None = None, password: str | None = None, db: str | None = None) -> str:
    m = re.match(r"^postgres(?:ql)?://([^:@/]+):([^@/]*)@([^/]+)/([^?]*)(\?.*)?$", url)
    if not m:
        raise SystemExit(f"soak.py: cannot parse the PostgreSQL URL (user:password@host:port/db expected)")
    u, p, hostport, d, q = m.groups()
    return f"postgres://{user or u}:{password if password is not None else p}@{hostport}/{db or d}{q or ''}"


def psql(url: str, sql: str, timeout: float = 600) -> str:
    """One statement (or a script) through `psql -XAtq`; returns stdout."""
    r = subprocess.run(
        ["psql", url, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql],
        capture_output=True, text=True, timeout=timeout,
    )
    if r.returncode != 0:
        raise RuntimeError(f"psql failed ({r.returncode}): {r.stderr.strip()}\nSQL: {sql[:400]}")
    return r.stdout


def psql_rows(url: str, sql: str, timeout: float = 600) -> list[list[str]]:
    out = psql(url, sql, timeout)
    return [line.split("|") for line in out.splitlines() if line]


class PsqlPipe:
    """A long-running psql fed SQL on stdin (a crm client's session)."""

    def __init__(self, url: str, logfile: Path):
        self.log = open(logfile, "w")
        self.proc = subprocess.Popen(
            ["psql", url, "-Xq", "-v", "ON_ERROR_STOP=1"],
            stdin=subprocess.PIPE, stdout=self.log, stderr=self.log, text=True,
        )

    def send(self, sql: str) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"a generator's psql exited ({self.proc.returncode}); see {self.log.name}")
        self.proc.stdin.write(sql + "\n")
        self.proc.stdin.flush()

    def close(self) -> int:
        try:
            if self.proc.poll() is None:
                self.proc.stdin.close()
            rc = self.proc.wait(timeout=30)
        except (subprocess.TimeoutExpired, BrokenPipeError, OSError):
            self.proc.kill()
            rc = self.proc.wait()
        self.log.close()
        return rc


# --- statistics -------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def slope_per_hour(ts: list[float], ys: list[float]) -> float | None:
    """Least-squares slope, units per hour (ts in seconds)."""
    n = len(ts)
    if n < 2:
        return None
    mt, my = sum(ts) / n, sum(ys) / n
    den = sum((t - mt) ** 2 for t in ts)
    if den == 0:
        return None
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / den * 3600


def r(x, nd=1):
    return None if x is None else round(x, nd)


# --- the run ----------------------------------------------------------------------------


class Soak:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.work = Path(a.work)
        self.out = Path(a.out)
        self.owner_url = url_with(a.pg_url, db="crm")
        self.worker_password = uuid.uuid4().hex
        self.worker_url = url_with(a.pg_url, user=WORKER_ROLE, password=self.worker_password, db="crm")
        self.instances: list[dict] = []
        self.pipes: list[PsqlPipe] = []
        self.threads: list[threading.Thread] = []
        self.stop_generators = threading.Event()
        self.gen_error: list[str] = []
        self.lock = threading.Lock()
        # Arrivals known to the manager: id -> [phase, approximate deadline (epoch s)].
        self.live: dict[str, list] = {}
        self.arrivals = 0
        self.manager_ops = {"extend": 0, "cancel": 0, "confirm": 0, "book": 0}
        self.samples: list[dict] = []
        self.seen_audit: set[int] = set()
        self.audit_low = 0
        self.timings: dict[str, float] = {}
        self.retention_s: float | None = None

    # -- set-up --

    def setup(self) -> None:
        t = time.time()
        base = self.a.pg_url
        if psql(base, "SELECT count(*) FROM pg_database WHERE datname = 'crm'").strip() != "1":
            psql(base, "CREATE DATABASE crm")
        psql(base, f"CREATE ROLE {WORKER_ROLE} LOGIN PASSWORD '{self.worker_password}'")
        if self.a.pg_stat_statements:
            psql(self.owner_url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.run_bin(["migrate"], self.owner_url)
        grants = (REPO / "deploy/postgres/grants.sql").read_text()
        psql(self.owner_url, grants)
        self.timings["setup_s"] = time.time() - t
        self.retention_s = self.outbox_retention()
        log(f"crm database migrated; worker role {WORKER_ROLE} with deploy/postgres/grants.sql; "
            f"outbox retention {self.retention_s:.0f} s (the binary's default)")

    def run_bin(self, args: list[str], url: str) -> str:
        r = subprocess.run([self.a.bin, *args], env=self.bin_env(url), capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"booking-expiration {' '.join(args)} failed ({r.returncode}): {r.stderr[-2000:]}")
        return r.stdout

    def bin_env(self, url: str, metrics: str | None = None) -> dict:
        # Nothing inherited but PATH and HOME: every other setting keeps its default.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
        env["DATABASE_URL"] = url
        env["KAFKA_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{self.a.kafka_port}"
        if metrics:
            env["METRICS_ADDR"] = metrics
        return env

    def outbox_retention(self) -> float:
        """OUTBOX_RETENTION's default as the binary shows it in `run --help`."""
        text = self.run_bin(["run", "--help"], self.owner_url)
        m = re.search(r"--outbox-retention.*?\[default: ([0-9]+)(ms|s|m|h|d)\]", text, re.S)
        if not m:
            raise RuntimeError("cannot read OUTBOX_RETENTION's default from `run --help`")
        return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]

    def fill(self) -> None:
        t = time.time()
        rows, tenants = self.a.rows, self.a.tenants
        chunk = 250_000
        # 1 row in 100 active with a deadline 1 to 60 days away (Reserve and Booking
        # phase); the rest terminal: expired, cancelled or confirmed over the past year.
        for start in range(1, rows + 1, chunk):
            end = min(rows, start + chunk - 1)
            psql(self.owner_url, f"""
INSERT INTO bookings (id, tenant_id, deal_id, property_object_id, status, reserve_expires_at,
                      booking_expires_at, expired_at, created_at, updated_at, version)
SELECT gen_random_uuid(), ('00000000-0000-4000-8000-' || lpad((i % {tenants})::text, 12, '0'))::uuid,
       gen_random_uuid(), gen_random_uuid(), s.status,
       CASE WHEN s.status IN ('Reserved','AwaitingPayment') THEN now() + interval '1 day' + random() * interval '59 days'
            ELSE c.created + interval '3 days' END,
       CASE WHEN s.status = 'Booked' THEN now() + interval '1 day' + random() * interval '59 days'
            WHEN s.status IN ('Reserved','AwaitingPayment','ReserveExpired') THEN NULL
            ELSE c.created + interval '17 days' END,
       CASE s.status WHEN 'ReserveExpired' THEN c.created + interval '3 days'
                     WHEN 'BookingExpired' THEN c.created + interval '17 days' END,
       c.created, c.created + interval '3 days', 3
  FROM generate_series({start}::bigint, {end}::bigint) AS i
 CROSS JOIN LATERAL (SELECT CASE WHEN i % 100 = 0
            THEN (ARRAY['Reserved','AwaitingPayment','Booked'])[1 + (i / 100) % 3]
            ELSE (ARRAY['ReserveExpired','BookingExpired','Cancelled','Confirmed'])[1 + i % 4] END AS status) s
 CROSS JOIN LATERAL (SELECT now() - interval '20 days' - random() * interval '345 days' AS created) c
""", timeout=1800)
        psql(self.owner_url, "VACUUM (ANALYZE) bookings", timeout=1800)
        psql(self.owner_url, "CHECKPOINT", timeout=600)
        self.timings["fill_s"] = time.time() - t
        n = psql(self.owner_url, "SELECT count(*), count(DISTINCT tenant_id), "
                 "count(*) FILTER (WHERE status IN ('Reserved','AwaitingPayment','Booked')), "
                 "pg_size_pretty(pg_total_relation_size('bookings')) FROM bookings").strip()
        log(f"bookings filled in {self.timings['fill_s']:.0f} s (rows|tenants|active|size: {n})")

    # -- instances --

    def start_instances(self) -> None:
        ports = [int(p) for p in self.a.metrics_ports.split(",")]
        if len(ports) < self.a.instances:
            raise SystemExit("soak.py: --metrics-ports needs one port per instance")
        for i in range(self.a.instances):
            addr = f"127.0.0.1:{ports[i]}"
            logf = self.work / f"instance-{i + 1}.log"
            fh = open(logf, "wb")
            p = subprocess.Popen([self.a.bin, "run"], env=self.bin_env(self.worker_url, addr),
                                 stdout=fh, stderr=fh, stdin=subprocess.DEVNULL, start_new_session=True)
            fh.close()
            self.instances.append({"n": i + 1, "proc": p, "addr": addr, "log": logf, "exit": None})
            with open(self.work / "pids", "a") as f:
                f.write(f"{p.pid}\n")
        deadline = time.time() + 90
        for inst in self.instances:
            while True:
                if inst["proc"].poll() is not None:
                    raise RuntimeError(f"instance {inst['n']} exited ({inst['proc'].returncode}) at start-up; "
                                       f"see {inst['log']}")
                try:
                    with urllib.request.urlopen(f"http://{inst['addr']}/readyz", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"instance {inst['n']} not ready within 90 s; see {inst['log']}")
                time.sleep(0.5)
        log(f"{len(self.instances)} instances ready (pids "
            f"{', '.join(str(i['proc'].pid) for i in self.instances)})")

    def stop_instances(self) -> None:
        for inst in self.instances:
            if inst["proc"].poll() is None:
                inst["proc"].send_signal(signal.SIGTERM)
        for inst in self.instances:
            try:
                inst["exit"] = inst["proc"].wait(timeout=30)
            except subprocess.TimeoutExpired:
                inst["proc"].kill()
                inst["exit"] = f"killed after 30 s ({inst['proc'].wait()})"
        (self.work / "pids").unlink(missing_ok=True)

    # -- generators --

    def arrivals_loop(self) -> None:
        pipe = PsqlPipe(self.owner_url, self.work / "arrivals-psql.log")
        self.pipes.append(pipe)
        rnd = random.Random(self.a.seed)
        tenants = [f"00000000-0000-4000-8000-{t:012d}" for t in range(self.a.tenants)]
        lo, hi = math.log(self.a.hold_min), math.log(self.a.hold_max)
        tick = 0.2
        next_at = time.time()
        try:
            while not self.stop_generators.is_set():
                now = time.time()
                values, born = [], []
                while next_at <= now:
                    next_at += rnd.expovariate(self.a.rate)
                    hold = math.exp(rnd.uniform(lo, hi))
                    bid = str(uuid.uuid4())
                    x = rnd.random()
                    status = "Reserved" if x < 0.4 else "AwaitingPayment" if x < 0.6 else "Booked"
                    dl = f"now() + make_interval(secs => {hold:.3f})"
                    rexp, bexp = (dl, "NULL") if status != "Booked" else ("now() - interval '1 day'", dl)
                    values.append(f"('{bid}','{rnd.choice(tenants)}',gen_random_uuid(),gen_random_uuid(),"
                                  f"'{status}',{rexp},{bexp})")
                    born.append((bid, "Booking" if status == "Booked" else "Reserve", now + hold))
                if values:
                    pipe.send("INSERT INTO bookings (id, tenant_id, deal_id, property_object_id, status, "
                              "reserve_expires_at, booking_expires_at) VALUES " + ",".join(values) + ";")
                    with self.lock:
                        self.arrivals += len(values)
                        for bid, phase, dl in born:
                            self.live[bid] = [phase, dl]
                self.stop_generators.wait(tick)
        except Exception as e:  # noqa: BLE001 - reported by the main loop
            self.gen_error.append(f"arrivals: {e}")

    def manager_loop(self) -> None:
        pipe = PsqlPipe(self.owner_url, self.work / "manager-psql.log")
        self.pipes.append(pipe)
        rnd = random.Random(self.a.seed + 1)
        lo, hi = math.log(self.a.hold_min), math.log(self.a.hold_max)
        next_at = time.time() + rnd.expovariate(self.a.manager_rate)
        try:
            while not self.stop_generators.is_set():
                wait = next_at - time.time()
                if wait > 0:
                    self.stop_generators.wait(min(wait, 0.5))
                    continue
                next_at += rnd.expovariate(self.a.manager_rate)
                now = time.time()
                with self.lock:
                    for bid in [k for k, v in self.live.items() if v[1] < now - 1]:
                        del self.live[bid]
                    if not self.live:
                        continue
                    # Managers act near a deadline more often than not: a third of the
                    # commands go to bookings due within 5 s (races with the worker).
                    near = [k for k, v in self.live.items() if v[1] < now + 5] if rnd.random() < 1 / 3 else []
                    bid = rnd.choice(near) if near else rnd.choice(list(self.live))
                    phase, dl = self.live[bid]
                x = rnd.random()
                cond = f"WHERE id = '{bid}' AND status IN ('Reserved','AwaitingPayment','Booked')"
                touch = "updated_at = now(), version = version + 1"
                if x < 0.45:
                    op = "extend"
                    extra = math.exp(rnd.uniform(lo, hi))
                    ext = f"make_interval(secs => {extra:.3f})"
                    sql = (f"UPDATE bookings SET reserve_expires_at = CASE WHEN status IN ('Reserved','AwaitingPayment') "
                           f"THEN reserve_expires_at + {ext} ELSE reserve_expires_at END, "
                           f"booking_expires_at = CASE WHEN status = 'Booked' THEN booking_expires_at + {ext} "
                           f"ELSE booking_expires_at END, {touch} {cond};")
                    new = [phase, dl + extra]
                elif x < 0.65:
                    op, sql, new = "cancel", f"UPDATE bookings SET status = 'Cancelled', {touch} {cond};", None
                elif x < 0.80:
                    op, sql, new = "confirm", f"UPDATE bookings SET status = 'Confirmed', {touch} {cond};", None
                else:
                    op = "book"
                    hold = math.exp(rnd.uniform(lo, hi))
                    sql = (f"UPDATE bookings SET status = 'Booked', booking_expires_at = now() + "
                           f"make_interval(secs => {hold:.3f}), {touch} WHERE id = '{bid}' "
                           f"AND status IN ('Reserved','AwaitingPayment');")
                    new = ["Booking", now + hold] if phase == "Reserve" else [phase, dl]
                pipe.send(sql)
                with self.lock:
                    self.manager_ops[op] += 1
                    if new is None:
                        self.live.pop(bid, None)
                    elif bid in self.live:
                        self.live[bid] = new
        except Exception as e:  # noqa: BLE001
            self.gen_error.append(f"manager: {e}")

    # -- sampling --

    def sample(self, t0: float, prev: dict | None) -> dict:
        s: dict = {"t": time.time()}
        s["t_s"] = round(s["t"] - t0, 1)
        alive = 0
        for inst in self.instances:
            n, pid = inst["n"], inst["proc"].pid
            rss, fds = None, None
            if inst["proc"].poll() is None:
                alive += 1
                try:
                    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
                    rss = int(m.group(1)) if m else None
                    fds = len(os.listdir(f"/proc/{pid}/fd"))
                except OSError:
                    pass
            s[f"rss_kib_{n}"], s[f"fds_{n}"] = rss, fds
        s["instances_alive"] = alive
        ret = self.retention_s + RETENTION_SWEEP_SLACK_S
        stmts = ("(SELECT coalesce(sum(calls), 0) FROM pg_stat_statements st "
                 f"JOIN pg_roles ro ON ro.oid = st.userid WHERE ro.rolname = '{WORKER_ROLE}')"
                 if self.a.pg_stat_statements else
                 "(SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'crm')")
        worker_wal = ("(SELECT coalesce(sum(wal_bytes), 0) FROM pg_stat_statements st "
                      f"JOIN pg_roles ro ON ro.oid = st.userid WHERE ro.rolname = '{WORKER_ROLE}')"
                      if self.a.pg_stat_statements else "NULL")
        row = psql_rows(self.owner_url, f"""
SELECT (SELECT count(*) FROM booking_expiration_audit),
       (SELECT count(*) FROM booking_expiration_outbox),
       (SELECT count(*) FROM booking_expiration_outbox WHERE published_at IS NULL AND parked_at IS NULL),
       (SELECT count(*) FROM booking_expiration_outbox WHERE parked_at IS NOT NULL),
       (SELECT count(*) FROM booking_expiration_outbox
         WHERE published_at < now() - make_interval(secs => {ret})),
       pg_total_relation_size('booking_expiration_outbox'),
       pg_total_relation_size('booking_expiration_audit'),
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'booking_expiration_outbox'),
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'booking_expiration_audit'),
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'bookings'),
       pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'),
       (SELECT count(*) FROM pg_stat_activity WHERE usename = '{WORKER_ROLE}'),
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),
       {stmts},
       {DUE_BACKLOG},
       {worker_wal}
""", timeout=120)[0]
        keys = ["audit_rows", "outbox_rows", "outbox_unpublished", "outbox_parked", "outbox_past_retention",
                "outbox_bytes", "audit_bytes", "outbox_dead", "audit_dead", "bookings_dead", "wal_lsn",
                "db_conn_worker", "db_conn_total", "statements", "due_backlog", "worker_wal"]
        for k, v in zip(keys, row):
            s[k] = None if v == "" else float(v) if k in ("wal_lsn", "worker_wal") else int(float(v))
        # Lateness of the expiries that committed since the last sample (audit ids
        # are assigned before commit, so read back a margin and keep the unseen ones).
        late = []
        for aid, ms in psql_rows(self.owner_url, f"""
SELECT a.id, round(extract(epoch FROM a.at - {EXPIRED_DEADLINE}) * 1000, 1)
  FROM booking_expiration_audit a JOIN bookings b ON b.id = a.booking_id
 WHERE a.id > {self.audit_low}""", timeout=120):
            aid = int(aid)
            if aid not in self.seen_audit:
                self.seen_audit.add(aid)
                late.append(float(ms))
        if self.seen_audit:
            self.audit_low = max(0, max(self.seen_audit) - 5000)
        s["expired_interval"] = len(late)
        s["late_p50_ms"], s["late_p99_ms"] = pct(late, 50), pct(late, 99)
        s["late_max_ms"] = max(late) if late else None
        s["late_min_ms"] = min(late) if late else None
        s["log_bytes"] = sum(inst["log"].stat().st_size for inst in self.instances if inst["log"].exists())
        s["log_bytes_per_expired"] = s["log_bytes"] / s["audit_rows"] if s["audit_rows"] else None
        with self.lock:
            s["arrivals"] = self.arrivals
            s["manager_ops"] = sum(self.manager_ops.values())
        if prev:
            dt = s["t"] - prev["t"]
            d_exp = s["audit_rows"] - prev["audit_rows"]
            s["stmts_per_min"] = (s["statements"] - prev["statements"]) * 60 / dt
            s["wal_bytes_interval"] = s["wal_lsn"] - prev["wal_lsn"]
            s["wal_per_expired"] = s["wal_bytes_interval"] / d_exp if d_exp else None
            s["worker_wal_per_expired"] = ((s["worker_wal"] - prev["worker_wal"]) / d_exp
                                           if d_exp and s["worker_wal"] is not None else None)
            s["log_bytes_per_expired_interval"] = (s["log_bytes"] - prev["log_bytes"]) / d_exp if d_exp else None
        else:
            s["stmts_per_min"] = s["wal_bytes_interval"] = s["wal_per_expired"] = None
            s["worker_wal_per_expired"] = None
            s["log_bytes_per_expired_interval"] = None
        s["kafka_p99_ms"] = None  # filled in from the topic at the end
        return s

    # -- the end --

    def drain(self, deadline_s: float = 60) -> float:
        t = time.time()
        while time.time() - t < deadline_s:
            row = psql_rows(self.owner_url, f"""
SELECT {DUE_BACKLOG},
       (SELECT count(*) FROM booking_expiration_outbox WHERE published_at IS NULL AND parked_at IS NULL)""")[0]
            if row == ["0", "0"]:
                break
            time.sleep(1)
        return time.time() - t

    def statements_top(self, n: int = 12) -> list[dict]:
        """The worker role's most frequent statements over the whole run."""
        out = psql(self.owner_url, f"""
SELECT st.calls, round(st.total_exec_time::numeric, 1), st.rows,
       regexp_replace(left(st.query, 160), '\\s+', ' ', 'g')
  FROM pg_stat_statements st JOIN pg_roles ro ON ro.oid = st.userid
 WHERE ro.rolname = '{WORKER_ROLE}' ORDER BY st.calls DESC LIMIT {n}""")
        rows = [line.split("|", 3) for line in out.splitlines() if line]
        return [{"calls": int(c), "total_ms": float(t), "rows": int(rw), "query": q} for c, t, rw, q in rows]

    def consume_topic(self) -> list[dict]:
        dump = self.work / "topic.jsonl"
        t = time.time()
        r = subprocess.run(["bash", str(REPO / "scripts/kafka.sh"), "consume", str(self.a.kafka_port), TOPIC,
                            str(dump), "0", "5000"], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"kafka.sh consume failed: {r.stderr[-2000:]}")
        recs = []
        with open(dump) as f:
            for line in f:
                o = json.loads(line)
                recs.append({"key": o["key"], "ts": o["timestamp"] / 1000.0, "partition": o["partition"]})
        self.timings["consume_s"] = time.time() - t
        return recs

    def verify(self, start_ts: float, end_ts: float, recs: list[dict]) -> dict:
        cutoff = end_ts - DUE_CUTOFF_S
        since = f"to_timestamp({start_ts:.6f})"
        q = lambda sql: int(psql(self.owner_url, sql).strip())  # noqa: E731
        v = {}
        v["due_not_expired"] = q(f"""SELECT count(*) FROM bookings b WHERE b.created_at >= {since}
            AND b.status IN ('Reserved','AwaitingPayment','Booked')
            AND {PHASE_DEADLINE.format(b='b')} < to_timestamp({cutoff:.6f})""")
        v["expired_more_than_once"] = q("""SELECT count(*) FROM (SELECT booking_id FROM booking_expiration_audit
            GROUP BY booking_id HAVING count(*) > 1) d""")
        v["expired_without_audit"] = q(f"""SELECT count(*) FROM bookings b WHERE b.created_at >= {since}
            AND b.status IN ('ReserveExpired','BookingExpired')
            AND NOT EXISTS (SELECT 1 FROM booking_expiration_audit a WHERE a.booking_id = b.id)""")
        v["audit_status_mismatch"] = q("""SELECT count(*) FROM booking_expiration_audit a
            JOIN bookings b ON b.id = a.booking_id WHERE b.status <> a.to_status""")
        v["expired_before_deadline"] = q(f"""SELECT count(*) FROM booking_expiration_audit a
            JOIN bookings b ON b.id = a.booking_id WHERE a.at <= {EXPIRED_DEADLINE}""")
        v["seeded_rows_touched"] = q(f"""SELECT count(*) FROM booking_expiration_audit a
            JOIN bookings b ON b.id = a.booking_id WHERE b.created_at < {since}""")
        v["manager_won"] = q(f"""SELECT count(*) FROM bookings WHERE created_at >= {since}
            AND status IN ('Cancelled','Confirmed')""")
        # Expiries and their deadlines, for the topic.
        expired = {}
        for bid, dl, at in psql_rows(self.owner_url, f"""SELECT a.booking_id,
                extract(epoch FROM {EXPIRED_DEADLINE}), extract(epoch FROM a.at)
                FROM booking_expiration_audit a JOIN bookings b ON b.id = a.booking_id"""):
            expired[bid] = (float(dl), float(at))
        v["expired_total"] = len(expired)
        first: dict[str, float] = {}
        counts: dict[str, int] = {}
        for rec in recs:
            k = rec["key"]
            counts[k] = counts.get(k, 0) + 1
            if k not in first or rec["ts"] < first[k]:
                first[k] = rec["ts"]
        v["topic_records"] = len(recs)
        v["topic_keys"] = len(counts)
        v["missing_on_topic"] = sum(1 for k in expired if k not in counts)
        v["unexpected_on_topic"] = sum(1 for k in counts if k not in expired)
        v["duplicate_records_on_topic"] = sum(c - 1 for c in counts.values() if c > 1)
        v["keys_with_duplicates"] = sum(1 for c in counts.values() if c > 1)
        kafka_lat = {k: (first[k] - dl) * 1000 for k, (dl, _at) in expired.items() if k in first}
        v["deadline_to_kafka_ms"] = {
            "p50": r(pct(list(kafka_lat.values()), 50)),
            "p99": r(pct(list(kafka_lat.values()), 99)),
            "max": r(max(kafka_lat.values())) if kafka_lat else None,
        }
        # Per interval, by the record's timestamp.
        times = [s["t"] for s in self.samples]
        buckets: dict[int, list[float]] = {}
        for k, ms in kafka_lat.items():
            i = bisect.bisect_left(times, first[k])
            if i < len(times):
                buckets.setdefault(i, []).append(ms)
        for i, s in enumerate(self.samples):
            s["kafka_p99_ms"] = pct(buckets.get(i, []), 99)
        return v

    # -- goals --

    def goals(self, verify: dict) -> tuple[list[dict], dict]:
        smp = self.samples
        n = len(smp)
        mid, last = smp[n // 3: 2 * n // 3], smp[2 * n // 3:]
        steady = smp[n // 3:]
        results, figures = [], {}

        def flat(metric: str, tol: tuple[float, float], unit: str, scale: float):
            if n < MIN_SAMPLES_FLAT:
                results.append({"goal": f"{metric} flat", "ok": False,
                                "detail": f"run too short to judge: {n} samples, at least {MIN_SAMPLES_FLAT} "
                                          "needed (a third of warm-up, then two thirds to compare)"})
                return
            for inst in self.instances:
                key = f"{metric}_{inst['n']}"
                m = mean([s[key] for s in mid if s[key] is not None])
                l_ = mean([s[key] for s in last if s[key] is not None])
                sl = slope_per_hour([s["t_s"] for s in steady if s[key] is not None],
                                    [s[key] for s in steady if s[key] is not None])
                allowed = None if m is None else max(m * tol[0], tol[1])
                ok = m is not None and l_ is not None and l_ - m <= allowed
                figures[key] = {"middle_third_mean": r(m and m / scale, 2), "last_third_mean": r(l_ and l_ / scale, 2),
                                "slope_per_hour": r(sl and sl / scale, 2), "unit": unit,
                                "max": r(max((s[key] for s in smp if s[key] is not None), default=0) / scale, 2)}
                results.append({"goal": f"{metric} flat, instance {inst['n']}", "ok": ok,
                                "detail": f"middle third {m and m / scale:.2f} {unit}, last third "
                                          f"{l_ and l_ / scale:.2f} {unit} (allowed +{(allowed or 0) / scale:.2f}), "
                                          f"slope {0 if sl is None else sl / scale:+.2f} {unit}/h"
                                if m is not None and l_ is not None else "no samples"})

        flat("rss_kib", RSS_TOLERANCE, "MiB", 1024)
        flat("fds", FDS_TOLERANCE, "fds", 1)

        bad = [(s["t_s"], s["late_p99_ms"]) for s in smp if s["late_p99_ms"] is not None
               and s["late_p99_ms"] >= LATENESS_P99_MS]
        with_exp = [s for s in smp if s["expired_interval"]]
        results.append({"goal": f"lateness p99 < {LATENESS_P99_MS:.0f} ms in every interval", "ok": not bad and bool(with_exp),
                        "detail": f"{len(with_exp)} intervals with expiries; worst p99 "
                                  f"{max((s['late_p99_ms'] for s in with_exp), default=0):.0f} ms"
                                  + (f"; over the goal at t={', '.join(f'{t:.0f}s ({v:.0f} ms)' for t, v in bad)}"
                                     if bad else "")})

        worst_backlog = max((s["outbox_unpublished"] for s in smp), default=0)
        past = max((s["outbox_past_retention"] for s in smp), default=0)
        results.append({"goal": "outbox bounded", "ok": worst_backlog <= OUTBOX_BACKLOG_MAX and past == 0,
                        "detail": f"unpublished rows at most {worst_backlog} (goal <= {OUTBOX_BACKLOG_MAX}); "
                                  f"published rows older than retention {self.retention_s:.0f} s + "
                                  f"{RETENTION_SWEEP_SLACK_S} s: at most {past} (goal 0); rows at the end "
                                  f"{smp[-1]['outbox_rows'] if smp else 0} = the expiries of the last "
                                  f"{self.retention_s / 3600:g} h"})

        lost_keys = ["due_not_expired", "expired_more_than_once", "expired_without_audit", "audit_status_mismatch",
                     "expired_before_deadline", "seeded_rows_touched", "missing_on_topic", "unexpected_on_topic"]
        lost = {k: verify[k] for k in lost_keys if verify[k]}
        results.append({"goal": "nothing lost (expired exactly once, on the topic)", "ok": not lost and verify["expired_total"] > 0,
                        "detail": (f"{verify['expired_total']} expired, each once, all on the topic "
                                   f"({verify['duplicate_records_on_topic']} duplicate records, allowed)")
                        if not lost else ", ".join(f"{k}={v}" for k, v in lost.items())})

        died = [s["t_s"] for s in smp if s["instances_alive"] < len(self.instances)]
        exits = [i["exit"] for i in self.instances]
        results.append({"goal": "instances ran throughout and exited 0 on SIGTERM",
                        "ok": not died and all(e == 0 for e in exits),
                        "detail": f"exit statuses {exits}" + (f"; fewer alive at t={died[0]:.0f}s" if died else "")})
        return results, figures

    # -- output --

    def write_outputs(self, summary: dict) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        cols = ["t_s"] + [f"rss_kib_{i['n']}" for i in self.instances] + [f"fds_{i['n']}" for i in self.instances] + [
            "instances_alive", "db_conn_worker", "db_conn_total", "arrivals", "manager_ops", "audit_rows",
            "expired_interval", "due_backlog", "late_p50_ms", "late_p99_ms", "late_max_ms", "late_min_ms",
            "kafka_p99_ms", "statements", "stmts_per_min", "outbox_rows", "outbox_unpublished", "outbox_parked",
            "outbox_past_retention", "outbox_bytes", "outbox_dead", "audit_bytes", "audit_dead", "bookings_dead",
            "log_bytes", "log_bytes_per_expired", "log_bytes_per_expired_interval", "wal_lsn", "wal_bytes_interval",
            "wal_per_expired", "worker_wal", "worker_wal_per_expired"]
        with open(self.out / "samples.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for s in self.samples:
                w.writerow(["" if s.get(c) is None else (round(s[c], 1) if isinstance(s[c], float) else s[c])
                            for c in cols])
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (self.out / "soak.svg").write_text(svg(self.samples, self.instances, summary))

    # -- main --

    def run(self) -> int:
        a = self.a
        t_begin = time.time()
        self.setup()
        self.fill()
        self.start_instances()
        self.arrivals_from = time.time() - 1  # seeded rows are 20 days old or more
        for target in (self.arrivals_loop, self.manager_loop):
            th = threading.Thread(target=target, daemon=True)
            th.start()
            self.threads.append(th)
        t0 = time.time()
        end = t0 + a.minutes * 60
        log(f"steady phase: {a.minutes:g} min, {a.rate:g} arrivals/s, {a.manager_rate:g} manager commands/s, "
            f"a sample every {a.sample_seconds:g} s")
        prev = None
        next_sample = t0 + a.sample_seconds
        while True:
            time.sleep(max(0.0, min(next_sample, end) - time.time()))
            if self.gen_error:
                raise RuntimeError("; ".join(self.gen_error))
            s = self.sample(t0, prev)
            self.samples.append(s)
            prev = s
            rss = "/".join(f"{(s['rss_kib_%d' % i['n']] or 0) / 1024:.1f}" for i in self.instances)
            log(f"t={s['t_s']:5.0f}s expired={s['audit_rows']} (+{s['expired_interval']}) "
                f"late p50/p99/max={fmt(s['late_p50_ms'])}/{fmt(s['late_p99_ms'])}/{fmt(s['late_max_ms'])} ms "
                f"rss={rss} MiB conns={s['db_conn_worker']} stmts/min={fmt(s['stmts_per_min'])} "
                f"outbox={s['outbox_rows']} (unpub {s['outbox_unpublished']}) backlog={s['due_backlog']}")
            if time.time() >= end - 0.5:
                break
            next_sample += a.sample_seconds
        end_ts = time.time()
        self.stop_generators.set()
        for th in self.threads:
            th.join(timeout=30)
        rcs = [p.close() for p in self.pipes]
        if self.gen_error or any(rcs):
            raise RuntimeError(f"generators failed: {self.gen_error} psql exits {rcs}")
        self.timings["drain_s"] = self.drain()
        self.stop_instances()
        self.top_statements = self.statements_top() if a.pg_stat_statements else []
        recs = self.consume_topic()
        verify = self.verify(self.arrivals_from, end_ts, recs)
        results, figures = self.goals(verify)
        smp = self.samples
        lat_all = [s["late_p99_ms"] for s in smp if s["late_p99_ms"] is not None]
        summary = {
            "minutes": a.minutes, "instances": a.instances, "rows": a.rows, "tenants": a.tenants,
            "arrival_rate_per_s": a.rate, "manager_rate_per_s": a.manager_rate,
            "hold_s": [a.hold_min, a.hold_max], "sample_seconds": a.sample_seconds,
            "postgres": "default durability (fsync on, synchronous_commit on, full_page_writes on)",
            "statements_source": ("pg_stat_statements calls of the worker role" if a.pg_stat_statements else
                                  "pg_stat_database xact_commit + xact_rollback of the crm database "
                                  "(transactions of everyone, not statements: pg_stat_statements unavailable)"),
            "outbox_retention_s": self.retention_s,
            "arrivals": self.arrivals, "manager_ops": self.manager_ops,
            "verify": verify,
            "worker_statements_top": self.top_statements,
            "figures": {
                **figures,
                "lateness_ms_worst_interval_p99": r(max(lat_all, default=None)),
                "lateness_ms_worst_max": r(max((s["late_max_ms"] for s in smp if s["late_max_ms"] is not None), default=None)),
                "lateness_ms_median_interval_p50": r(pct([s["late_p50_ms"] for s in smp if s["late_p50_ms"] is not None], 50)),
                "deadline_to_kafka_ms": verify["deadline_to_kafka_ms"],
                "deadline_to_kafka_ms_worst_interval_p99": r(max((s["kafka_p99_ms"] for s in smp if s["kafka_p99_ms"] is not None), default=None)),
                "statements_per_min_mean": r(mean([s["stmts_per_min"] for s in smp if s["stmts_per_min"] is not None])),
                "db_connections_worker_max": max((s["db_conn_worker"] for s in smp), default=None),
                "log_bytes_per_expired_end": r(smp[-1]["log_bytes_per_expired"]) if smp else None,
                "wal_bytes_per_expired_mean": r(sum(s["wal_bytes_interval"] or 0 for s in smp[1:]) /
                                                max(1, smp[-1]["audit_rows"] - smp[0]["audit_rows"])) if len(smp) > 1 else None,
                "worker_wal_bytes_per_expired_mean": r((smp[-1]["worker_wal"] - smp[0]["worker_wal"]) /
                                                       max(1, smp[-1]["audit_rows"] - smp[0]["audit_rows"]))
                if len(smp) > 1 and smp[0]["worker_wal"] is not None else None,
                "outbox_rows_end": smp[-1]["outbox_rows"] if smp else None,
                "outbox_bytes_end": smp[-1]["outbox_bytes"] if smp else None,
                "outbox_dead_max": max((s["outbox_dead"] or 0 for s in smp), default=None),
                "audit_rows_end": smp[-1]["audit_rows"] if smp else None,
                "audit_bytes_end": smp[-1]["audit_bytes"] if smp else None,
                "bookings_dead_end": smp[-1]["bookings_dead"] if smp else None,
            },
            "goals": results,
            "timings_s": {k: round(v, 1) for k, v in {**self.timings, "total": time.time() - t_begin}.items()},
        }
        self.write_outputs(summary)
        for g in results:
            log(f"{'ok  ' if g['ok'] else 'FAIL'} {g['goal']}: {g['detail']}")
        log(f"samples.csv, summary.json, soak.svg in {self.out}")
        failed = [g for g in results if not g["ok"]]
        if a.check and failed:
            for g in failed:
                print(f"soak: goal failed: {g['goal']}: {g['detail']}")
            return 1
        return 0

    def cleanup(self) -> None:
        self.stop_generators.set()
        for p in self.pipes:
            if p.proc.poll() is None:
                p.proc.terminate()
        if any(i["exit"] is None for i in self.instances):
            self.stop_instances()


def fmt(x) -> str:
    return "-" if x is None else f"{x:.0f}"


# --- SVG --------------------------------------------------------------------------------

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def nice_num(v: float) -> str:
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.3g}G"
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    if a >= 100 or v == int(v):
        return f"{v:.0f}"
    return f"{v:.3g}"


def nice_ceil(v: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above v."""
    e = 10 ** math.floor(math.log10(v))
    return next(m * e for m in (1, 2, 2.5, 5, 10) if m * e >= v)


def panel(x0, y0, w, h, title, series, xmax, goal=None) -> str:
    """One small multiple: series = [(label, [(x, y or None)...])]."""
    out = [f'<g transform="translate({x0},{y0})">',
           f'<text x="0" y="12" font-size="12" font-weight="bold">{esc(title)}</text>']
    px, py, pw, ph = 44, 22, w - 54, h - 44
    ys = [y for _, pts in series for _, y in pts if y is not None]
    if goal is not None:
        ys.append(goal)
    lo = min(0.0, min(ys)) if ys else 0.0
    hi = max(ys) if ys else 1.0
    if hi <= lo:
        hi = lo + 1
    hi = lo + nice_ceil((hi - lo) * 1.02)
    X = lambda x: px + pw * x / xmax  # noqa: E731
    Y = lambda y: py + ph - ph * (y - lo) / (hi - lo)  # noqa: E731
    out.append(f'<rect x="{px}" y="{py}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#bbb"/>')
    for frac in (0, 0.5, 1):
        yv = lo + (hi - lo) * frac
        out.append(f'<line x1="{px}" y1="{Y(yv):.1f}" x2="{px + pw}" y2="{Y(yv):.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{px - 4}" y="{Y(yv) + 4:.1f}" font-size="10" text-anchor="end">{nice_num(yv)}</text>')
    for frac in (0, 0.5, 1):
        xv = xmax * frac
        out.append(f'<text x="{X(xv):.1f}" y="{py + ph + 13}" font-size="10" text-anchor="middle">'
                   f'{xv / 60:.3g} min</text>')
    if goal is not None:
        out.append(f'<line x1="{px}" y1="{Y(goal):.1f}" x2="{px + pw}" y2="{Y(goal):.1f}" stroke="#d62728" '
                   f'stroke-dasharray="4 3"/><text x="{px + pw - 2}" y="{Y(goal) - 3:.1f}" font-size="9" '
                   f'text-anchor="end" fill="#d62728">goal</text>')
    lx = px
    for i, (label, pts) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        seg, segs = [], []
        for x, y in pts:
            if y is None:
                if seg:
                    segs.append(seg)
                seg = []
            else:
                seg.append(f"{X(x):.1f},{Y(y):.1f}")
        if seg:
            segs.append(seg)
        for sg in segs:
            if len(sg) == 1:
                cx, cy = sg[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{c}"/>')
            else:
                out.append(f'<polyline points="{" ".join(sg)}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        out.append(f'<text x="{lx}" y="{py + ph + 28}" font-size="10" fill="{c}">{esc(label)}</text>')
        lx += 7 * len(label) + 14
    out.append("</g>")
    return "\n".join(out)


def svg(samples: list[dict], instances: list[dict], summary: dict) -> str:
    xmax = max([s["t_s"] for s in samples] + [1])

    def ser(key, scale=1.0):
        return [(s["t_s"], None if s.get(key) is None else s[key] / scale) for s in samples]

    panels = [
        ("RSS per instance (MiB)", [(f"#{i['n']}", ser(f"rss_kib_{i['n']}", 1024)) for i in instances], None),
        ("open fds per instance", [(f"#{i['n']}", ser(f"fds_{i['n']}")) for i in instances], None),
        ("DB connections", [("worker role", ser("db_conn_worker")), ("all clients", ser("db_conn_total"))], None),
        ("lateness of expiries in the interval (ms)",
         [("p50", ser("late_p50_ms")), ("p99", ser("late_p99_ms")), ("max", ser("late_max_ms"))], LATENESS_P99_MS),
        ("deadline -> Kafka p99 (ms)", [("p99", ser("kafka_p99_ms"))], None),
        ("statements / min" if "statements" in summary["statements_source"] else "transactions / min",
         [("worker" if "worker" in summary["statements_source"] else "crm db", ser("stmts_per_min"))], None),
        ("outbox", [("rows", ser("outbox_rows")), ("unpublished", ser("outbox_unpublished")),
                    ("dead tuples", ser("outbox_dead"))], None),
        ("audit rows", [("rows", ser("audit_rows")), ("dead tuples", ser("audit_dead"))], None),
        ("log bytes per expired booking", [("cumulative", ser("log_bytes_per_expired")),
                                           ("interval", ser("log_bytes_per_expired_interval"))], None),
        ("WAL bytes per expired booking", [("all writers", ser("wal_per_expired")),
                                           ("worker role", ser("worker_wal_per_expired"))], None),
        ("bookings (cumulative)", [("expired", ser("audit_rows")), ("arrivals", ser("arrivals")),
                                   ("manager cmds", ser("manager_ops"))], None),
        ("due backlog (active, deadline > 1 s ago)", [("rows", ser("due_backlog"))], None),
    ]
    cols, w, h = 3, 340, 190
    rows = math.ceil(len(panels) / cols)
    failed = [g["goal"] for g in summary["goals"] if not g["ok"]]
    head = (f"booking-expiration soak: {summary['instances']} instances, {summary['minutes']:g} min, "
            f"{summary['arrival_rate_per_s']:g} arrivals/s, {summary['rows']:,} bookings; "
            f"expired {summary['verify']['expired_total']}; goals "
            + ("all met" if not failed else "FAILED: " + "; ".join(failed)))
    body = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * w + 20}" height="{rows * h + 40}" '
            f'font-family="sans-serif">', '<rect width="100%" height="100%" fill="white"/>',
            f'<text x="10" y="20" font-size="13">{esc(head)}</text>']
    for k, (title, series, goal) in enumerate(panels):
        body.append(panel(10 + (k % cols) * w, 32 + (k // cols) * h, w - 10, h - 6, title, series, xmax, goal))
    body.append("</svg>")
    return "\n".join(body) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--out", required=True)
    p.add_argument("--check", action="store_true", help="exit 1 when a goal fails")
    p.add_argument("--rate", type=float, default=10, help="arrivals per second (default 10)")
    p.add_argument("--manager-rate", type=float, default=1, help="manager commands per second (default 1)")
    p.add_argument("--hold-min", type=float, default=3, help="shortest hold, s (default 3)")
    p.add_argument("--hold-max", type=float, default=7200, help="longest hold, s (default 7200)")
    p.add_argument("--sample-seconds", type=float, default=15)
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--tenants", type=int, default=1000)
    p.add_argument("--seed", type=int, default=20261205, help="random seed of the generators")
    p.add_argument("--work", required=True, help="scratch folder (logs, topic dump)")
    p.add_argument("--bin", required=True)
    p.add_argument("--pg-url", required=True, help="owner URL of the server (postgres role)")
    p.add_argument("--kafka-port", type=int, required=True)
    p.add_argument("--metrics-ports", required=True, help="comma-separated, one per instance")
    p.add_argument("--pg-stat-statements", action="store_true",
                   help="the server preloads pg_stat_statements (statements per minute from it)")
    a = p.parse_args()
    if shutil.which("psql") is None:
        raise SystemExit("soak.py: psql not found")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    soak = Soak(a)
    try:
        return soak.run()
    except Stop as e:
        log(f"stopped by {e}")
        return 130
    finally:
        soak.cleanup()


if __name__ == "__main__":
    sys.exit(main())
