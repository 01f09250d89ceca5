"""Start the real monitoring half of failslow for tests: Prometheus and Alertmanager from the repo configs.

The configs are copied verbatim into a temporary directory; only what must differ per test run is
changed there: the file_sd target files (free loopback ports) and the remediator webhook URL and
token. Processes are started on free loopback ports and stopped by PID. Missing binaries or a
process that does not become ready raise, so the calling test fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

REPO = Path(__file__).resolve().parents[2]  # failslow_cli/stack/ -> repo
PROMETHEUS_DIR = REPO / "prometheus"
ALERTMANAGER_DIR = REPO / "alertmanager"
GRAFANA_DIR = REPO / "grafana"
RUNBOOKS_DIR = REPO / "runbooks"

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
AMTOOL = "/usr/bin/amtool"


def require_binary(path: str) -> str:
    """Return `path` if it is an executable, else raise: a missing component fails the test."""
    if not Path(path).is_file() or shutil.which(path) is None:
        raise RuntimeError(f"{path} is missing: install the Debian package (scripts/bootstrap.sh does)")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _targets(addrs: list[str]) -> list[dict[str, Any]]:
    return [{"targets": addrs}] if addrs else []


def render_prometheus(
    dest: Path,
    *,
    prometheus: str,
    alertmanager: str | list[str] | None = None,
    exporters: list[str] | None = None,
    detector: list[str] | None = None,
    remediator: list[str] | None = None,
    scrape_interval: str | None = None,
    evaluation_interval: str | None = None,
) -> Path:
    """Copy prometheus.yml and rules/ into `dest`, write target files; return the config path.

    `scrape_interval` / `evaluation_interval` override the global defaults (the dashboard test uses
    1s to have data quickly); everything else is the file as shipped.
    """
    dest.mkdir(parents=True, exist_ok=True)
    cfg = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    if scrape_interval:
        cfg["global"]["scrape_interval"] = scrape_interval
        cfg["global"]["scrape_timeout"] = scrape_interval
    if evaluation_interval:
        cfg["global"]["evaluation_interval"] = evaluation_interval
    (dest / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    shutil.copytree(PROMETHEUS_DIR / "rules", dest / "rules", dirs_exist_ok=True)
    tdir = dest / "targets"
    tdir.mkdir(exist_ok=True)
    files = {
        "prometheus.json": [prometheus],
        "alertmanager.json": [alertmanager] if isinstance(alertmanager, str) else list(alertmanager or []),
        "exporter.json": exporters or [],
        "detector.json": detector or [],
        "remediator.json": remediator or [],
    }
    for name, addrs in files.items():
        (tdir / name).write_text(json.dumps(_targets(addrs)))
    return dest / "prometheus.yml"


def render_alertmanager(dest: Path, *, remediator_url: str, token: str) -> Path:
    """Copy alertmanager.yml into `dest` with the remediator URL replaced and the token file written."""
    dest.mkdir(parents=True, exist_ok=True)
    cfg = yaml.safe_load((ALERTMANAGER_DIR / "alertmanager.yml").read_text())
    hooks = [w for r in cfg["receivers"] if r["name"] == "remediator" for w in r["webhook_configs"]]
    if len(hooks) != 1:
        raise RuntimeError("alertmanager.yml: expected exactly one remediator webhook")
    hooks[0]["url"] = remediator_url
    token_file = dest / hooks[0]["http_config"]["authorization"]["credentials_file"]
    token_file.write_text(token)
    token_file.chmod(0o600)
    (dest / "alertmanager.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return dest / "alertmanager.yml"


@dataclass
class Service:
    """A started server process and the base URL it answers on."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        """Terminate by PID and reap; kill if it does not exit promptly."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _wait_ready(svc: Service, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if svc.proc.poll() is not None:
            raise RuntimeError(f"{svc.proc.args[0]} exited ({svc.proc.returncode}):\n{svc.log.read_text()[-3000:]}")
        try:
            if requests.get(svc.url + path, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    svc.stop()
    raise RuntimeError(f"{svc.proc.args[0]} not ready after {timeout}s:\n{svc.log.read_text()[-3000:]}")


@contextmanager
def _http_daemon(argv: list[str], config: Path, port: int, name: str, timeout: float) -> Iterator[Service]:
    """Start a Prometheus-family daemon logging next to `config`, wait for /-/ready, stop it on exit."""
    require_binary(argv[0])
    log = config.parent / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=config.parent)
    svc = Service(proc, f"http://127.0.0.1:{port}", log)
    try:
        _wait_ready(svc, "/-/ready", timeout)
        yield svc
    finally:
        svc.stop()


def prometheus(config: Path, port: int, *, timeout: float = 30.0) -> AbstractContextManager[Service]:
    """Run /usr/bin/prometheus on 127.0.0.1:`port` with `config`, its TSDB next to the config."""
    return _http_daemon([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={config.parent / 'data'}",
                         f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"],
                        config, port, "prometheus", timeout)


def alertmanager(config: Path, port: int, *, timeout: float = 30.0) -> AbstractContextManager[Service]:
    """Run prometheus-alertmanager on 127.0.0.1:`port` (clustering off), data next to the config."""
    return _http_daemon([ALERTMANAGER, f"--config.file={config}", f"--storage.path={config.parent / 'am-data'}",
                         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                        config, port, "alertmanager", timeout)


def alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule in prometheus/rules/*.yml."""
    out = []
    for f in sorted((PROMETHEUS_DIR / "rules").glob("*.yml")):
        for g in yaml.safe_load(f.read_text())["groups"]:
            out.extend(r for r in g["rules"] if "alert" in r)
    return out


def recording_rules() -> list[dict[str, Any]]:
    """Every recording rule in prometheus/rules/*.yml."""
    out = []
    for f in sorted((PROMETHEUS_DIR / "rules").glob("*.yml")):
        for g in yaml.safe_load(f.read_text())["groups"]:
            out.extend(r for r in g["rules"] if "record" in r)
    return out


# --- the whole alert path: testbed job -> exporter -> Prometheus -> detector -> Alertmanager -> webhook ---

REDIS = "/usr/bin/redis-server"


@contextmanager
def redis_server(workdir: Path, port: int, *, timeout: float = 20.0, persist: bool = False) -> Iterator[Service]:
    """Run a private redis-server on 127.0.0.1:`port`, stopped by PID.

    Without `persist` it keeps nothing on disk. With it, every write goes to an append-only file in `workdir`
    (fsync'd at once), so a server started again on the same `workdir` has every key back: what a restart of
    the remediator's Redis must not lose.
    """
    require_binary(REDIS)
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "redis.log"
    durability = ["--appendonly", "yes", "--appendfsync", "always"] if persist else ["--appendonly", "no"]
    with open(log, "ab") as out:
        proc = subprocess.Popen([REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *durability,
                                 "--dir", str(workdir)], stdout=out, stderr=subprocess.STDOUT)
    svc = Service(proc, f"redis://127.0.0.1:{port}/0", log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited ({proc.returncode}):\n{log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server not ready after {timeout}s")
            time.sleep(0.1)
        yield svc
    finally:
        svc.stop()


def start_process(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a failslow service (or any command) with its output in `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def stop_process(proc: subprocess.Popen[Any], *, kill: bool = False) -> None:
    """Stop by PID: SIGTERM and reap (SIGKILL at once with `kill`, or when it does not exit in 20 s)."""
    if proc.poll() is None:
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def wait_http(url: str, proc: subprocess.Popen[Any], log: Path, timeout: float = 60) -> None:
    """Wait until `url` answers 200 while `proc` lives; raise with the log tail otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not answering after {timeout}s:\n{log.read_text()[-3000:]}")


@dataclass
class Remediator:
    """A running `failslow remediator` process: its URL, token, config and log."""

    proc: subprocess.Popen[bytes]
    url: str
    token: str
    log: Path
    workdir: Path

    def headers(self) -> dict[str, str]:
        """The Authorization header its API wants."""
        return {"Authorization": f"Bearer {self.token}"}

    def get(self, path: str, **params: Any) -> Any:
        """GET a JSON document from its API."""
        r = requests.get(self.url + path, params=params, headers=self.headers(), timeout=10)
        r.raise_for_status()
        return r.json()


def start_remediator(workdir: Path, port: int, *, redis_url: str, prometheus_url: str, token: str,
                     config: dict[str, Any] | None = None, mode: str = "dry-run", replica: str | None = None,
                     env: dict[str, str] | None = None, timeout: float = 60.0) -> Remediator:
    """Start `failslow remediator` on 127.0.0.1:`port` with a config written from `config`; wait for /healthz.

    Stop it with :func:`stop_process` (``kill=True`` for a SIGKILL).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    token_file = workdir / "remediator.token"
    if not token_file.exists():
        token_file.write_text(token)
        token_file.chmod(0o600)
    cfg = workdir / "remediator.yml"
    cfg.write_text(yaml.safe_dump(config or {}, sort_keys=False))
    log = workdir / f"remediator-{replica or port}.log"
    proc = start_process([*failslow_cli(), "remediator", "--config", str(cfg)], log, env={
        "FAILSLOW_REMEDIATOR_HOST": "127.0.0.1", "FAILSLOW_REMEDIATOR_PORT": str(port),
        "FAILSLOW_REMEDIATOR_REDIS_URL": redis_url, "FAILSLOW_REMEDIATOR_PROMETHEUS_URL": prometheus_url,
        "FAILSLOW_REMEDIATOR_TOKEN_FILE": str(token_file), "FAILSLOW_REMEDIATOR_MODE": mode,
        **({"FAILSLOW_REMEDIATOR_REPLICA": replica} if replica else {}), **(env or {})})
    rem = Remediator(proc, f"http://127.0.0.1:{port}", token, log, workdir)
    try:
        wait_http(rem.url + "/healthz", proc, log, timeout)
    except BaseException:
        stop_process(proc)
        raise
    return rem


@dataclass
class Webhook:
    """One POST the stand-in remediator received, with the wall time it arrived."""

    t: float
    path: str
    auth: str | None
    body: dict[str, Any]


class WebhookReceiver:
    """A real HTTP server standing in for the remediator's /api/v1/alerts."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.posts: list[Webhook] = []
        self.on_post: Any = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                t = time.time()
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                hook = Webhook(t, self.path, self.headers.get("Authorization"), body)
                outer.posts.append(hook)
                if outer.on_post is not None:
                    outer.on_post(hook)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/api/v1/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, alertname: str, status: str, job: str) -> list[tuple[float, dict[str, Any]]]:
        """(arrival time, alert) for every delivered alert with this name, status and training job."""
        return [(h.t, a) for h in self.posts for a in h.body.get("alerts", [])
                if a["labels"].get("alertname") == alertname and a["status"] == status
                and a["labels"].get("job") == job]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def failslow_cli() -> list[str]:
    """argv prefix of the installed `failslow` CLI next to this interpreter."""
    import sys

    exe = Path(sys.executable).parent / "failslow"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "failslow_cli"]
