#!/usr/bin/env python3
"""Checks of the operator-facing files, called by scripts/check-deploy.sh.

    check_deploy.py json         every *.json under deploy/grafana parses
    check_deploy.py dashboard    pin-crm: title, row "Background jobs", panels,
                                 datasource, and only known metric names
    check_deploy.py grafana      the provisioning files point where compose mounts
    check_deploy.py runbooks     every runbook_url in alerts.yml names an existing
                                 file and heading anchor; every panel named in a
                                 "dashboard" annotation exists
    check_deploy.py metrics      the metric names used here match the ones
                                 registered in src/telemetry/metrics.rs
    check_deploy.py live         a real Prometheus (the binary of Debian's
                                 `prometheus` package) on loopback scrapes a stand-in
                                 exporter that serves the worker's metric names, loads
                                 alerts.yml, and answers every dashboard query

Standard library only. Run from the repository root. Exit status 0 = passed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path.cwd()
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
DASHBOARD = ROOT / "deploy/grafana/dashboards/pin-crm.json"
GRAFANA = ROOT / "deploy/grafana"
METRICS_RS = ROOT / "src/telemetry/metrics.rs"

# The metrics the worker exports (spec §6, src/telemetry/metrics.rs), as
# registered: counters without "_total" (the OpenMetrics encoder adds it).
COUNTERS = {
    "crm_booking_expiration_items": ["phase"],
    "crm_booking_expiration_skip_locked": [],
    "crm_booking_expiration_errors": [],
    "crm_booking_expiration_cycles_failed": [],
    "crm_booking_expiration_clock_skew_backoffs": [],
    "crm_booking_expiration_outbox_published": [],
    "crm_booking_expiration_outbox_publish_errors": [],
    "crm_booking_expiration_outbox_deleted": [],
    "crm_booking_expiration_outbox_produce_errors": ["code"],
    "crm_booking_expiration_kafka_metadata_refreshes": ["reason"],
    "crm_booking_expiration_kafka_throttled_responses": [],
    "crm_booking_expiration_kafka_throttle_seconds": [],
    "crm_booking_expiration_outbox_handoff_missed": [],
    "crm_booking_expiration_outbox_handoff_released": [],
}
GAUGES = [
    "crm_booking_expiration_backlog",
    "crm_booking_expiration_last_success_timestamp_seconds",
    "crm_booking_expiration_clock_skew_seconds",
    "crm_booking_expiration_clock_skew_exceeded",
    "crm_booking_expiration_outbox_unpublished",
    "crm_booking_expiration_outbox_oldest_unpublished_age_seconds",
    "crm_booking_expiration_outbox_parked",
    "crm_booking_expiration_outbox_held",
    "crm_booking_expiration_outbox_partitions_failing",
    "crm_booking_expiration_expiry_waker",
]


def gauge_values() -> dict[str, float]:
    """What a healthy worker's gauges read; one value for every name in GAUGES."""
    return {
        "crm_booking_expiration_backlog": 7,
        "crm_booking_expiration_last_success_timestamp_seconds": int(time.time()) - 3,
        "crm_booking_expiration_clock_skew_seconds": 0.01,
        "crm_booking_expiration_clock_skew_exceeded": 0,
        "crm_booking_expiration_outbox_unpublished": 12,
        "crm_booking_expiration_outbox_oldest_unpublished_age_seconds": 2,
        "crm_booking_expiration_outbox_parked": 0,
        "crm_booking_expiration_outbox_held": 12,
        "crm_booking_expiration_outbox_partitions_failing": 0,
        "crm_booking_expiration_expiry_waker": 1,
    }


HISTOGRAMS = {
    "crm_booking_expiration_cycle_duration_seconds":
        [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
    "crm_booking_expiration_outbox_produce_duration_seconds":
        [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
    "crm_booking_expiration_outbox_commit_to_ack_seconds":
        [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
    "crm_booking_expiration_lateness_seconds":
        [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0],
}


def series_names() -> set[str]:
    """Every series name Prometheus stores for the worker."""
    names = {c + "_total" for c in COUNTERS} | set(GAUGES)
    for h in HISTOGRAMS:
        names |= {h + "_bucket", h + "_sum", h + "_count"}
    return names


class Failures:
    def __init__(self) -> None:
        self.items: list[str] = []

    def __call__(self, message: str) -> None:
        self.items.append(message)
        print(f"  FAIL {message}", file=sys.stderr)

    def exit(self, what: str) -> None:
        if self.items:
            print(f"{what}: {len(self.items)} problem(s)", file=sys.stderr)
            sys.exit(1)
        print(f"{what}: ok")


# --------------------------------------------------------------------------
# static checks

def cmd_json() -> None:
    fail = Failures()
    files = sorted(GRAFANA.rglob("*.json"))
    if not files:
        fail(f"no *.json under {GRAFANA.relative_to(ROOT)}")
    for path in files:
        r = subprocess.run([sys.executable, "-m", "json.tool", str(path)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode:
            fail(f"{path.relative_to(ROOT)}: {r.stderr.strip()}")
        else:
            print(f"  valid JSON: {path.relative_to(ROOT)}")
    fail.exit("json")


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(dash: dict) -> list[dict]:
    out = []
    for p in dash.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))  # panels of a collapsed row
    return out


def panels_under_row(dash: dict, title: str) -> list[dict] | None:
    """The panels of the row titled `title`: nested (collapsed row) or the
    top-level panels that follow it up to the next row."""
    top = dash.get("panels", [])
    for i, p in enumerate(top):
        if p.get("type") == "row" and p.get("title") == title:
            if p.get("collapsed"):
                return p.get("panels", [])
            following = []
            for q in top[i + 1:]:
                if q.get("type") == "row":
                    break
                following.append(q)
            return following
    return None


def dashboard_exprs(dash: dict) -> list[tuple[str, str]]:
    return [(p.get("title", "?"), t["expr"]) for p in all_panels(dash)
            for t in p.get("targets", []) if t.get("expr")]


METRIC_RE = re.compile(r"\bcrm_booking_expiration_[a-z0-9_]+")

# What the brief asks the row to show: (what, a regex one of its queries matches).
REQUIRED_QUERIES = [
    ("cycle duration p50", r"histogram_quantile\(0\.5,.*crm_booking_expiration_cycle_duration_seconds_bucket"),
    ("cycle duration p99", r"histogram_quantile\(0\.99,.*crm_booking_expiration_cycle_duration_seconds_bucket"),
    ("items per phase rate", r"by \(phase\).*rate\(crm_booking_expiration_items_total"),
    ("backlog", r"crm_booking_expiration_backlog\b"),
    ("skip-locked rate", r"rate\(crm_booking_expiration_skip_locked_total"),
    ("errors rate", r"rate\(crm_booking_expiration_errors_total"),
    ("outbox unpublished", r"crm_booking_expiration_outbox_unpublished\b"),
    ("outbox oldest age", r"crm_booking_expiration_outbox_oldest_unpublished_age_seconds"),
    ("publish errors", r"rate\(crm_booking_expiration_outbox_publish_errors_total"),
    ("commit-to-ack p99", r"histogram_quantile\(0\.99,.*crm_booking_expiration_outbox_commit_to_ack_seconds_bucket"),
]


def cmd_dashboard() -> None:
    fail = Failures()
    dash = load_dashboard()
    if dash.get("title") != "pin-crm":
        fail(f'dashboard title is {dash.get("title")!r}, not "pin-crm"')
    row = panels_under_row(dash, "Background jobs")
    if row is None:
        fail('no row panel titled "Background jobs"')
        row = []
    elif not row:
        fail('row "Background jobs" has no panels')
    row_exprs = [t["expr"] for p in row for t in p.get("targets", []) if t.get("expr")]
    for what, pattern in REQUIRED_QUERIES:
        if not any(re.search(pattern, e) for e in row_exprs):
            fail(f'row "Background jobs": no query for {what} (/{pattern}/)')
    known = series_names()
    for title, expr in dashboard_exprs(dash):
        for name in METRIC_RE.findall(expr):
            if name not in known:
                fail(f"panel {title!r}: unknown metric {name}")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds_ok = {"prometheus"}
    if variables.get("datasource", {}).get("type") == "datasource":
        ds_ok.add("${datasource}")
        if variables["datasource"].get("current", {}).get("value") != "prometheus":
            fail('variable "datasource" does not default to the provisioned uid "prometheus"')
    for p in all_panels(dash):
        if p.get("type") == "row":
            continue
        for obj in [p] + p.get("targets", []):
            ds = obj.get("datasource")
            if not isinstance(ds, dict) or ds.get("uid") not in ds_ok:
                fail(f"panel {p.get('title')!r}: datasource {ds!r} is neither the provisioned uid nor ${{datasource}}")
    ids = [p.get("id") for p in all_panels(dash)]
    if len(ids) != len(set(ids)):
        fail("panel ids are not unique")
    print(f'  title "pin-crm", row "Background jobs" with {len(row)} panels: '
          + ", ".join(repr(p.get("title")) for p in row))
    fail.exit("dashboard")


def cmd_grafana() -> None:
    fail = Failures()
    ds = (GRAFANA / "provisioning/datasources/prometheus.yml").read_text()
    if not re.search(r"^\s*uid:\s*prometheus\s*$", ds, re.M):
        fail("datasource provisioning: no `uid: prometheus`")
    if not re.search(r"^\s*type:\s*prometheus\s*$", ds, re.M):
        fail("datasource provisioning: no `type: prometheus`")
    dp = (GRAFANA / "provisioning/dashboards/dashboards.yml").read_text()
    if not re.search(r"^\s*path:\s*/var/lib/grafana/dashboards\s*$", dp, re.M):
        fail("dashboard provisioning: options.path is not /var/lib/grafana/dashboards")
    for text, name in ((ds, "datasources"), (dp, "dashboards")):
        if not re.search(r"^apiVersion:\s*1\s*$", text, re.M):
            fail(f"{name} provisioning: no `apiVersion: 1`")
    fail.exit("grafana provisioning")


def github_slug(heading: str, seen: dict[str, int]) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"<[^>]+>", "", heading)           # inline HTML
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links -> their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    slug = text.replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    return slug if n == 0 else f"{slug}-{n}"


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            out.add(github_slug(m.group(1), seen))
        out.update(re.findall(r'<a\s+(?:id|name)="([^"]+)"', line))
    return out


def cmd_runbooks() -> None:
    fail = Failures()
    text = ALERTS.read_text()
    alerts = re.findall(r"^\s*- alert:\s*(\S+)", text, re.M)
    urls = re.findall(r"^\s*runbook_url:\s*['\"]?([^'\"\s]+)", text, re.M)
    if len(urls) != len(alerts):
        fail(f"{len(alerts)} alerts but {len(urls)} runbook_url annotations")
    for url in sorted(set(urls)):
        path, _, anchor = url.partition("#")
        file = ROOT / path
        if re.match(r"^[a-z]+://", path):
            fail(f"{url}: expected a repository path")
            continue
        if not file.is_file():
            fail(f"{url}: file {path} does not exist")
            continue
        if not anchor:
            fail(f"{url}: no #anchor")
            continue
        if anchor not in anchors(file):
            fail(f"{url}: no heading with anchor #{anchor} in {path} "
                 f"(has: {', '.join(sorted(anchors(file)))})")
            continue
        print(f"  {url}: ok")
    # the in-page links of the runbooks themselves
    for md in sorted((ROOT / "docs/runbooks").glob("*.md")):
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text()):
            if re.match(r"^[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            file = (md.parent / path) if path else md
            if not file.is_file():
                fail(f"{md.relative_to(ROOT)}: link {target}: no file {file}")
            elif anchor and anchor not in anchors(file):
                fail(f"{md.relative_to(ROOT)}: link {target}: no anchor #{anchor}")
    # panels named in the "dashboard" annotations exist in pin-crm
    titles = {p.get("title") for p in all_panels(load_dashboard())}
    for hint in re.findall(r"^\s*dashboard:\s*'(.*)'\s*$", text, re.M):
        m = re.search(r"panels? (.*)$", hint)
        for title in re.findall(r'"([^"]+)"', m.group(1)) if m else []:
            if title not in titles:
                fail(f"dashboard annotation names panel {title!r}, not in pin-crm.json")
    if len(re.findall(r"^\s*dashboard:", text, re.M)) != len(alerts):
        fail("not every alert has a dashboard annotation")
    for name in METRIC_RE.findall(text):
        if name not in series_names():
            fail(f"alerts.yml: unknown metric {name}")
    fail.exit("runbooks")


def cmd_metrics() -> None:
    fail = Failures()
    if not METRICS_RS.is_file():
        print(f"metrics: {METRICS_RS.relative_to(ROOT)} not found; skipped")
        return
    # only the names passed to registry.register(...), not those of its tests
    src = METRICS_RS.read_text()
    registered = set(re.findall(r'register\(\s*"(crm_booking_expiration_[a-z0-9_]+)"', src))
    ours = set(COUNTERS) | set(GAUGES) | set(HISTOGRAMS)
    for name in sorted(ours - registered):
        fail(f"{name} is used by the deploy files but not registered in {METRICS_RS.relative_to(ROOT)}")
    for name in sorted(registered - ours):
        fail(f"{name} is registered in {METRICS_RS.relative_to(ROOT)} but unknown to scripts/check_deploy.py")
    print(f"  {len(registered)} metrics registered, all known")
    fail.exit("metrics")


# --------------------------------------------------------------------------
# live check

# Counters that stand still for a healthy worker (else BookingExpirationErrors
# would be pending).
HEALTHY_FLAT = {
    "crm_booking_expiration_errors",
    "crm_booking_expiration_clock_skew_backoffs",
    "crm_booking_expiration_cycles_failed",
    "crm_booking_expiration_outbox_publish_errors",
    "crm_booking_expiration_outbox_handoff_missed",
    "crm_booking_expiration_outbox_handoff_released",
}


class StandIn:
    """Serves the worker's metric names in the OpenMetrics text the
    prometheus-client crate writes, with values that move on each scrape."""

    def __init__(self) -> None:
        missing = set(GAUGES) - set(gauge_values())
        if missing:
            raise SystemExit(f"check_deploy.py: the stand-in has no value for gauge(s) {sorted(missing)}; add them to gauge_values()")
        self.started = time.time()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = stand_in.render().encode()
                self.send_response(200)
                self.send_header("Content-Type",
                                 "application/openmetrics-text; version=1.0.0; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def render(self) -> str:
        t = time.time() - self.started
        n = int(t * 10) + 1  # grows ~10 per second
        out = []
        for name, buckets in HISTOGRAMS.items():
            out += [f"# HELP {name} stand-in", f"# TYPE {name} histogram"]
            # observations spread over the buckets: 1/4 under each of 3 bounds
            picks = [buckets[1], buckets[4], buckets[7]]
            out.append(f"{name}_sum {n * sum(picks) / 3:.6f}")
            out.append(f"{name}_count {n}")
            for b in buckets:
                c = sum(n // 3 + (1 if i < n % 3 else 0) for i, p in enumerate(picks) if p <= b)
                out.append(f'{name}_bucket{{le="{b}"}} {c}')
            out.append(f'{name}_bucket{{le="+Inf"}} {n}')
        for name, labels in COUNTERS.items():
            out += [f"# HELP {name} stand-in", f"# TYPE {name} counter"]
            if labels == ["code"]:
                # a healthy publisher: a few old produce errors, no new ones
                out.append(f'{name}_total{{code="NOT_LEADER_OR_FOLLOWER"}} 2')
            elif labels:
                out.append(f'{name}_total{{phase="reserve"}} {n * 2}')
                out.append(f'{name}_total{{phase="booking"}} {n}')
            elif name in HEALTHY_FLAT:
                out.append(f"{name}_total 3")  # a healthy worker: no new errors
            else:
                out.append(f"{name}_total {n}")
        values = gauge_values()
        for name in GAUGES:
            out += [f"# HELP {name} stand-in", f"# TYPE {name} gauge", f"{name} {values[name]}"]
        out.append("# EOF")
        return "\n".join(out) + "\n"

    def close(self) -> None:
        self.server.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def promql(base: str, expr: str) -> dict:
    return get_json(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))


def cmd_live() -> None:
    fail = Failures()
    binary = shutil.which("prometheus")
    if not binary:
        print("live: no prometheus binary (Debian package `prometheus`); skipped")
        return
    stand_in = StandIn()
    work = Path(tempfile.mkdtemp(prefix="check-deploy-"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    (work / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{json.dumps(str(ALERTS))}]\n"
        "scrape_configs:\n"
        "  - job_name: booking-expiration\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{stand_in.port}']}}]\n"
    )
    log = open(work / "prometheus.log", "w")
    proc = subprocess.Popen(
        [binary, f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 60
        while True:
            if proc.poll() is not None:
                fail(f"prometheus exited with {proc.returncode}: {(work / 'prometheus.log').read_text()[-2000:]}")
                fail.exit("live")
            try:
                r = promql(base, 'count_over_time(up{job="booking-expiration"}[1m])')
                v = r["data"]["result"]
                if v and float(v[0]["value"][1]) >= 6:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                fail("prometheus did not scrape the stand-in 6 times within 60 s")
                fail.exit("live")
            time.sleep(0.5)
        print(f"  prometheus {base} scraped the stand-in exporter on 127.0.0.1:{stand_in.port}")
        up = promql(base, 'up{job="booking-expiration"}')["data"]["result"]
        if not up or up[0]["value"][1] != "1":
            fail(f"stand-in target not up: {up}")

        # the alert rules, loaded and evaluated by a real server
        time.sleep(2)
        groups = get_json(f"{base}/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups if g["name"] == "booking-expiration" for r in g["rules"]]
        expected = re.findall(r"^\s*- alert:\s*(\S+)", ALERTS.read_text(), re.M)
        if [r["name"] for r in rules] != expected:
            fail(f"rules loaded {[r['name'] for r in rules]}, expected {expected}")
        for r in rules:
            if r.get("health") != "ok" or r.get("lastError"):
                fail(f"rule {r['name']}: health {r.get('health')} {r.get('lastError', '')}")
        firing = [a["labels"]["alertname"] for a in get_json(f"{base}/api/v1/alerts")["data"]["alerts"]]
        if firing:
            fail(f"alerts active for a healthy stand-in: {firing}")
        print(f"  {len(rules)} alert rules loaded, health ok, none active for healthy metrics")

        # every dashboard query returns data
        dash = load_dashboard()
        for title, expr in dashboard_exprs(dash):
            q = (expr.replace("$__rate_interval", "10s").replace("${instance}", ".*")
                 .replace("$instance", ".*"))
            r = promql(base, q)
            result = r.get("data", {}).get("result", [])
            values = [s["value"][1] for s in result]
            if r.get("status") != "success":
                fail(f"panel {title!r}: {expr}: {r}")
            elif not result:
                fail(f"panel {title!r}: {expr}: no data")
            elif any(v in ("NaN", "+Inf", "-Inf") for v in values):
                fail(f"panel {title!r}: {expr}: {values}")
            else:
                print(f"  panel {title!r}: {q} -> {', '.join(values)}")
        for v in dash.get("templating", {}).get("list", []):
            if v.get("type") != "query":
                continue
            m = re.match(r"label_values\((.*),\s*(\w+)\)$", v["definition"])
            if not m:
                fail(f"variable {v['name']}: cannot read {v['definition']}")
                continue
            url = f"{base}/api/v1/label/{m.group(2)}/values?" + urllib.parse.urlencode({"match[]": m.group(1)})
            got = get_json(url)["data"]
            if not got:
                fail(f"variable {v['name']}: {v['definition']} -> no values")
            else:
                print(f"  variable {v['name']}: {v['definition']} -> {got}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        stand_in.close()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    fail.exit("live")


COMMANDS = {
    "json": cmd_json, "dashboard": cmd_dashboard, "grafana": cmd_grafana,
    "runbooks": cmd_runbooks, "metrics": cmd_metrics, "live": cmd_live,
}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(COMMANDS)}")
    COMMANDS[sys.argv[1]]()
