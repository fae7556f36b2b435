#!/usr/bin/env python3
"""Static checks of docker-compose.yml, for machines without a Docker engine.

    python3 scripts/check-compose.py [docker-compose.yml]

Checks that every service has an image or a build (whose context and Dockerfile
exist), every depends_on target exists (and one-shot targets of
service_completed_successfully do not restart), every bind-mounted host path
exists in the repository and every named volume is declared, images come from the
allowed official list with a pinned tag, host ports are unique, the commands given
to the worker image are real subcommands, the topic created by kafka-init is the
one the worker writes, and the scrape targets of deploy/prometheus/prometheus.yml
and the Grafana datasource URL point at compose services. When a `docker compose`
or `docker-compose` binary is on PATH, `config --quiet` is run too.

Needs PyYAML (`pip install pyyaml` when missing). Exit status 0 = all passed; the
last line is "check-compose: N passed, N failed".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import yaml
except ImportError:  # pragma: no cover
    sys.exit("check-compose: PyYAML is missing (pip install pyyaml)")

ROOT = Path(__file__).resolve().parent.parent

# Official images (Docker Official Images or the projects' own publishers) and
# the image this repository builds.
ALLOWED_IMAGES = {
    "postgres": r"^(16|17)(\.\d+)?-alpine$|^(16|17)(\.\d+)?$",
    "apache/kafka": r"^4\.\d+\.\d+$",
    "prom/prometheus": r"^v3\.\d+\.\d+$",
    "grafana/grafana": r"^1[12]\.\d+\.\d+$",
    "booking-expiration": r"^local$",
}
LOCAL_IMAGE = "booking-expiration"
APP_COMMANDS = {"migrate", "run", "once", "status", "seed"}
DEPENDS_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}

passed = 0
failed = 0


def check(ok: bool, what: str) -> None:
    global passed, failed
    if ok:
        passed += 1
        print(f"ok    {what}")
    else:
        failed += 1
        print(f"FAIL  {what}")


def split_image(ref: str) -> tuple[str, str]:
    name, _, tag = ref.rpartition(":") if ":" in ref.split("/")[-1] else (ref, "", "")
    return (name, tag) if name else (ref, "")


def depends_of(service: dict) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {d: "service_started" for d in deps}
    return {k: (v or {}).get("condition", "service_started") for k, v in deps.items()}


def volumes_of(service: dict) -> list[tuple[str, str]]:
    """(source, target) of each volume entry, short or long syntax."""
    out = []
    for v in service.get("volumes") or []:
        if isinstance(v, str):
            parts = v.split(":")
            if len(parts) == 1:
                out.append(("", parts[0]))
            else:
                out.append((parts[0], parts[1]))
        else:
            out.append((v.get("source", ""), v.get("target", "")))
    return out


def env_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(e.split("=", 1) if "=" in e else (e, "") for e in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def host_of(target: str) -> str:
    target = re.sub(r"^[a-z]+://", "", target)
    return target.split("/")[0].rsplit(":", 1)[0]


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docker-compose.yml"
    base = path.resolve().parent
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    services: dict = doc.get("services") or {}
    declared_volumes = set((doc.get("volumes") or {}).keys())
    check(bool(services), f"{path.name} defines services ({', '.join(services)})")

    host_ports: dict[str, str] = {}
    for name, svc in services.items():
        image, build = svc.get("image"), svc.get("build")
        check(bool(image or build), f"{name}: has an image or a build")
        if build:
            context = build if isinstance(build, str) else build.get("context", ".")
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            ctx = (base / context).resolve()
            check(ctx.is_dir() and (ctx / dockerfile).is_file(),
                  f"{name}: build context {context} with {dockerfile} exists")
        if image:
            repo, tag = split_image(image)
            rule = ALLOWED_IMAGES.get(repo)
            check(rule is not None, f"{name}: image {image} is from the allowed list")
            if rule is not None:
                check(bool(re.match(rule, tag)), f"{name}: image {image} has a pinned tag")
            if repo == LOCAL_IMAGE:
                check(bool(build), f"{name}: the local image {image} is built here")

        for dep, condition in depends_of(svc).items():
            check(dep in services, f"{name}: depends_on {dep} exists")
            check(condition in DEPENDS_CONDITIONS, f"{name}: depends_on {dep} condition {condition} is valid")
            if dep not in services:
                continue
            target = services[dep]
            if condition == "service_healthy":
                check("healthcheck" in target, f"{name}: {dep} (service_healthy) has a healthcheck")
            if condition == "service_completed_successfully":
                check(str(target.get("restart", "no")) == "no",
                      f"{name}: {dep} (service_completed_successfully) is one-shot (restart: no)")
            if not svc.get("profiles"):
                check(not target.get("profiles"),
                      f"{name}: depends_on {dep} which is not hidden behind a profile")

        for source, target in volumes_of(svc):
            if not source:
                continue
            if source.startswith((".", "/", "~")):
                host = (base / os.path.expanduser(source)).resolve()
                inside = str(host).startswith(str(base))
                check(host.exists() and inside, f"{name}: bind mount {source} exists in the repository")
            else:
                check(source in declared_volumes, f"{name}: named volume {source} is declared")

        for port in svc.get("ports") or []:
            spec = str(port if not isinstance(port, dict) else port.get("published", ""))
            hostport = spec.split(":")[-2] if spec.count(":") >= 1 else spec
            check(hostport not in host_ports,
                  f"{name}: host port {hostport} is not also published by {host_ports.get(hostport, '-')}")
            host_ports.setdefault(hostport, name)

        if image and split_image(image)[0] == LOCAL_IMAGE:
            cmd = svc.get("command")
            check(isinstance(cmd, list) and bool(cmd) and cmd[0] in APP_COMMANDS,
                  f"{name}: command {cmd} is a booking-expiration subcommand")
            env = env_of(svc)
            for key in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS"):
                check(bool(env.get(key)), f"{name}: {key} is set")
            db_host = host_of(env.get("DATABASE_URL", "").split("@")[-1])
            check(db_host in services, f"{name}: DATABASE_URL host {db_host} is a service")
            for server in env.get("KAFKA_BOOTSTRAP_SERVERS", "").split(","):
                check(host_of(server) in services, f"{name}: Kafka bootstrap {server} is a service")
            if cmd and cmd[0] == "run":
                check(env.get("METRICS_ADDR", "").startswith("0.0.0.0:"),
                      f"{name}: METRICS_ADDR listens on all interfaces ({env.get('METRICS_ADDR')})")

    # The topic kafka-init creates is the one the worker writes.
    worker_topic = env_of(services.get("worker", {})).get("KAFKA_TOPIC", "pin.crm.booking-expired.v1")
    init_cmd = services.get("kafka-init", {}).get("command") or []
    if "--topic" in init_cmd:
        i = init_cmd.index("--topic")
        check(init_cmd[i + 1] == worker_topic, f"kafka-init creates the worker's topic {worker_topic}")
        if "--partitions" in init_cmd:
            p = init_cmd[init_cmd.index("--partitions") + 1]
            check(str(p) == "3", f"kafka-init creates {p} partitions (the contract says 3)")
    else:
        check(False, "kafka-init creates a topic")

    # Monitoring configs refer to compose services.
    prom_cfg = ROOT / "deploy/prometheus/prometheus.yml"
    if prom_cfg.is_file():
        cfg = yaml.safe_load(prom_cfg.read_text(encoding="utf-8")) or {}
        for job in cfg.get("scrape_configs") or []:
            for sc in job.get("static_configs") or []:
                for target in sc.get("targets") or []:
                    host = host_of(target)
                    check(host in services or host == "localhost",
                          f"prometheus job {job.get('job_name')}: target {target} is a compose service")
                    if host in services:
                        port = target.rsplit(":", 1)[-1]
                        listens = env_of(services[host]).get("METRICS_ADDR", "")
                        check(listens.endswith(":" + port),
                              f"prometheus target {target}: {host} listens on port {port}")
        for rule in cfg.get("rule_files") or []:
            mounted = any(t == f"/etc/prometheus/{rule}"
                          for _, t in volumes_of(services.get("prometheus", {})))
            check(mounted, f"prometheus rule file {rule} is mounted next to prometheus.yml")
    ds_dir = ROOT / "deploy/grafana/provisioning/datasources"
    for ds_file in sorted(ds_dir.glob("*.y*ml")) if ds_dir.is_dir() else []:
        for ds in (yaml.safe_load(ds_file.read_text(encoding="utf-8")) or {}).get("datasources") or []:
            host = host_of(ds.get("url", ""))
            check(host in services, f"grafana datasource {ds.get('name')}: {ds.get('url')} is a compose service")

    compose = None
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                 capture_output=True).returncode == 0:
        compose = ["docker", "compose"]
    elif shutil.which("docker-compose"):
        compose = ["docker-compose"]
    if compose:
        r = subprocess.run(compose + ["-f", str(path), "--profile", "demo", "config", "--quiet"],
                           capture_output=True, text=True, cwd=base)
        check(r.returncode == 0, f"`{' '.join(compose)} config --quiet` accepts the file"
              + (f": {r.stderr.strip()}" if r.returncode else ""))
    else:
        print("skip  no `docker compose` / `docker-compose` binary: schema not validated by Compose")

    print(f"check-compose: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
