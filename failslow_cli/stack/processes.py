"""Start the real monitoring half of failslow for tests: Prometheus and Alertmanager from the repo configs.

The configs are copied verbatim into a temporary directory; only what must differ per test run is
changed there: the file_sd target files (free loopback ports) and the remediator webhook URL and
token. Processes are started on free loopback ports and stopped by PID. Missing binaries or a
process that does not become ready raise, so the calling test fails instead of skipping.

Every server process is a :class:`Service`: `with` starts it and stops it; a test may also stop it (SIGTERM,
or SIGKILL with ``kill=True``) and start it again on the same port, config and data.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
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


_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that this process has not handed out before.

    Ports are taken several at a time before any of them is bound (one per service of a stack), and the
    kernel may offer a just-released port again: a bench run once gave Redis and the remediator the same one.
    """
    with _HANDED_OUT_LOCK:
        for _ in range(1000):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError("no free loopback port that was not handed out before")


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


def _http_ok(url: str) -> Callable[[], bool]:
    return lambda: requests.get(url, timeout=1).status_code == 200


def _wait_ready(proc: subprocess.Popen[Any], log: Path, ready: Callable[[], bool], timeout: float, what: str,
                pause: float = 0.1) -> None:
    """Until `ready()` holds while `proc` lives; raise with the log tail when it exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if ready():
                return
        except (OSError, requests.RequestException):
            pass
        time.sleep(pause)
    raise RuntimeError(f"{what} not ready after {timeout}s:\n{log.read_text()[-3000:]}")


@dataclass(eq=False)
class Service:
    """A server process on a loopback port, with the base URL it answers on and its log.

    Created stopped. ``with service:`` starts it and stops it on exit; :meth:`start` and :meth:`stop` do the
    same by hand, any number of times, with the same command line (port, config, data directory), so a test
    can take the process away (``stop(kill=True)`` for a SIGKILL) and bring it back.
    """

    argv: list[str]
    url: str
    log: Path
    ready: Callable[[], bool]  # true once the process serves (may raise OSError or RequestException)
    env: dict[str, str] | None = None
    cwd: Path | None = None
    no_proxy: bool = False
    timeout: float = 30.0
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        """The current process (the latest one started)."""
        if self._proc is None:
            raise RuntimeError(f"{self.argv[0]} was never started")
        return self._proc

    @property
    def running(self) -> bool:
        """Whether the process is started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Service:
        """Start the process and wait until it is ready; stop it and raise if it exits or is not ready in time."""
        if self.running:
            raise RuntimeError(f"{self.argv[0]} is already running")
        self._proc = start_process(self.argv, self.log, self.env, cwd=self.cwd, no_proxy=self.no_proxy)
        try:
            _wait_ready(self._proc, self.log, self.ready, self.timeout, self.argv[0])
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, *, kill: bool = False) -> None:
        """Stop it by PID and reap it (see :func:`stop_process`); nothing to do when it is not running."""
        if self._proc is not None:
            stop_process(self._proc, kill=kill)

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def http_service(argv: list[str], port: int, log: Path, *, ready_path: str = "/-/ready",
                 env: dict[str, str] | None = None, cwd: Path | None = None, no_proxy: bool = False,
                 timeout: float = 30.0) -> Service:
    """A :class:`Service` answering on http://127.0.0.1:`port`, ready once `ready_path` answers 200 (not started).

    For a failslow service pass its CLI argv (:func:`failslow_cli`) and ``ready_path="/metrics"``.
    """
    url = f"http://127.0.0.1:{port}"
    return Service(argv, url, log, _http_ok(url + ready_path), env=env, cwd=cwd, no_proxy=no_proxy, timeout=timeout)


def prometheus(config: Path, port: int, *, timeout: float = 30.0) -> Service:
    """/usr/bin/prometheus on 127.0.0.1:`port` with `config`, its TSDB and log next to the config (not started:
    ``with prometheus(...) as svc``). A restart keeps the TSDB."""
    return http_service([require_binary(PROMETHEUS), f"--config.file={config}",
                         f"--storage.tsdb.path={config.parent / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                         "--web.enable-lifecycle"], port, config.parent / "prometheus.log", cwd=config.parent,
                        timeout=timeout)


def alertmanager(config: Path, port: int, *, timeout: float = 30.0) -> Service:
    """prometheus-alertmanager on 127.0.0.1:`port` (clustering off), data and log next to the config (not
    started: ``with alertmanager(...) as svc``)."""
    return http_service([require_binary(ALERTMANAGER), f"--config.file={config}",
                         f"--storage.path={config.parent / 'am-data'}", f"--web.listen-address=127.0.0.1:{port}",
                         "--cluster.listen-address="], port, config.parent / "alertmanager.log", cwd=config.parent,
                        timeout=timeout)


def alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule in prometheus/rules/*.yml."""
    out: list[dict[str, Any]] = []
    for f in sorted((PROMETHEUS_DIR / "rules").glob("*.yml")):
        for g in yaml.safe_load(f.read_text())["groups"]:
            out.extend(r for r in g["rules"] if "alert" in r)
    return out


def recording_rules() -> list[dict[str, Any]]:
    """Every recording rule in prometheus/rules/*.yml."""
    out: list[dict[str, Any]] = []
    for f in sorted((PROMETHEUS_DIR / "rules").glob("*.yml")):
        for g in yaml.safe_load(f.read_text())["groups"]:
            out.extend(r for r in g["rules"] if "record" in r)
    return out


# --- the whole alert path: testbed job -> exporter -> Prometheus -> detector -> Alertmanager -> webhook ---

REDIS = "/usr/bin/redis-server"


def _redis_ping(port: int) -> Callable[[], bool]:
    def ping() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    return ping


def redis_server(workdir: Path, port: int, *, timeout: float = 20.0, persist: bool = False) -> Service:
    """A private redis-server on 127.0.0.1:`port`, stopped by PID (not started: ``with redis_server(...) as r``).

    Without `persist` it keeps nothing on disk. With it, every write goes to an append-only file in `workdir`
    (fsync'd at once), so a server started again on the same `workdir` (the same :class:`Service` restarted,
    or a new one) has every key back: what a restart of the remediator's or the detector's Redis must not lose.
    """
    require_binary(REDIS)
    workdir.mkdir(parents=True, exist_ok=True)
    durability = ["--appendonly", "yes", "--appendfsync", "always"] if persist else ["--appendonly", "no"]
    return Service([REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *durability,
                    "--dir", str(workdir)], f"redis://127.0.0.1:{port}/0", workdir / "redis.log", _redis_ping(port),
                   timeout=timeout)


_PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")


def env_without_proxy(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the HTTP(S) proxy variables, loopback marked NO_PROXY, plus `env`.

    For a process that talks to its loopback peers with `requests` (a detector polling the test's
    Prometheus): a proxy set in the caller's environment must not see that traffic.
    """
    out = {k: v for k, v in os.environ.items() if k not in _PROXY_VARS}
    out["NO_PROXY"] = "127.0.0.1,localhost"
    out.update(env or {})
    return out


def start_process(argv: list[str], log: Path, env: Mapping[str, str] | None = None, *, cwd: Path | None = None,
                  no_proxy: bool = False) -> subprocess.Popen[bytes]:
    """Start a failslow service (or any command) with its output appended to `log`.

    Its environment is this process's plus `env`; with `no_proxy`, without the proxy variables
    (:func:`env_without_proxy`).
    """
    full = env_without_proxy(env) if no_proxy else {**os.environ, **(env or {})}
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=full, cwd=cwd)


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
    _wait_ready(proc, log, _http_ok(url), timeout, url, pause=0.2)


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


def redis_service(tmp: Path) -> Service:
    """redis-server on a free loopback port, every write in an append-only file under `tmp`/redis, so a
    restart keeps its data (not started: ``with`` it, or ``start()`` it)."""
    return redis_server(tmp / "redis", free_port(), persist=True)


def prometheus_service(tmp: Path, exporters: Iterable[str], *, detectors: Iterable[str] = (),
                       interval: str = "200ms", evaluation_interval: str | None = None) -> Service:
    """The shipped Prometheus (prometheus.yml and rules, rendered under `tmp`/prom) on a free loopback port.

    `exporters` (host:port) are its failslow-exporter targets, `detectors` its failslow-detector targets; both
    jobs keep the training job label of the scraped series (honor_labels). Scrapes every `interval`; rules
    at the shipped interval unless `evaluation_interval`. Not started: ``with`` it, or ``start()`` it.
    """
    port = free_port()
    cfg = render_prometheus(tmp / "prom", prometheus=f"127.0.0.1:{port}", exporters=list(exporters),
                                      detector=list(detectors), scrape_interval=interval,
                                      evaluation_interval=evaluation_interval)
    return prometheus(cfg, port)


def detector_service(tmp: Path, port: int, *, prometheus_url: str, redis_url: str, poll_s: float,
                     argv: list[str] | None = None, env: dict[str, str] | None = None,
                     name: str = "detector") -> Service:
    """A detector service process on 127.0.0.1:`port`, configured by its FAILSLOW_DETECTOR_* environment.

    It polls `prometheus_url` every `poll_s` seconds and keeps its state in `redis_url`; `env` adds settings.
    `argv` is `failslow detector` unless given (``[sys.executable, "-m", "detector"]``, or the CLI with options).
    No proxy variables in its environment; its log is `tmp`/`name`.log. Not started; ready once /metrics
    answers, so ``stop(kill=True)`` then ``start()`` is a crash and a restart.
    """
    return http_service(argv or [*failslow_cli(), "detector"], port, tmp / f"{name}.log",
                        ready_path="/metrics", no_proxy=True, timeout=60.0, env={
                            "FAILSLOW_DETECTOR_PROMETHEUS_URL": prometheus_url,
                            "FAILSLOW_DETECTOR_REDIS_URL": redis_url, "FAILSLOW_DETECTOR_PORT": str(port),
                            "FAILSLOW_DETECTOR_ADDRESS": "127.0.0.1",
                            "FAILSLOW_DETECTOR_POLL_INTERVAL_S": str(poll_s), **(env or {})})
