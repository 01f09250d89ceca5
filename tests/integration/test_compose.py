"""docker-compose.yml, the Dockerfile and deploy/compose/ against the shipped configs (structure: no daemon here).

Every address one service uses to reach another must name a compose service on the port that service listens
on; the compose-specific configs in deploy/compose/ must differ from the shipped ones only in addresses; and
the real `docker compose config` must accept the file.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from failslow_cli.main import COMMANDS
from failslow_cli.stack.processes import AMTOOL, require_binary
from remediator.config import read_config
from remediator.settings import Settings

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
DEPLOY = REPO / "deploy" / "compose"
SHIPPED_AM = REPO / "alertmanager" / "alertmanager.yml"
COMPOSE_AM = DEPLOY / "alertmanager" / "alertmanager.yml"
COMPOSE_TARGETS = DEPLOY / "prometheus" / "targets"
FAILSLOW_SERVICES = ("detector", "remediator", "exporter")
# What each failslow service's port setting is called, and its default when the compose file sets none.
PORT_ENV = {"detector": "FAILSLOW_DETECTOR_PORT", "remediator": "FAILSLOW_REMEDIATOR_PORT",
            "exporter": "FAILSLOW_EXPORTER_PORT"}
# The listen ports of the upstream images (flag that changes it, default).
UPSTREAM_PORTS = {"prometheus": ("--web.listen-address", 9090), "alertmanager": ("--web.listen-address", 9093),
                  "redis": ("--port", 6379), "grafana": (None, 3000)}
REGEN = os.environ.get("FAILSLOW_REGEN_GOLDEN") == "1"
_DEFAULT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


# ---------------------------------------------------------------------------------------------- reading
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())  # merge keys (<<: *failslow) resolved
    return doc


def services() -> dict[str, dict[str, Any]]:
    svcs: dict[str, dict[str, Any]] = compose()["services"]
    return svcs


def interpolate(value: str) -> str:
    """`value` as compose resolves it with none of its variables set (``${X:-default}`` -> default)."""
    return _DEFAULT.sub(lambda m: m.group(2) or "", value)


def env(svc: dict[str, Any]) -> dict[str, str]:
    raw = svc.get("environment") or {}
    pairs = dict(x.split("=", 1) for x in raw) if isinstance(raw, list) else raw
    return {k: interpolate(str(v)) for k, v in pairs.items()}


def command(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def flag(args: list[str], name: str) -> str | None:
    """The value of ``--name=value`` or ``--name value`` in `args`."""
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def mounts(svc: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) of every volume of a service, short or long syntax."""
    out = []
    for v in svc.get("volumes") or []:
        if isinstance(v, str):
            parts = v.split(":")
            out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
        else:
            out.append((v["source"], v["target"], bool(v.get("read_only"))))
    return out


def bind_source(source: str) -> Path | None:
    """The host path of a bind mount (relative to the compose file); None for a named volume."""
    if source.startswith((".", "/", "~")):
        return (COMPOSE_FILE.parent / source).resolve()
    return None


def mount_of(svc: dict[str, Any], target: str) -> Path:
    """The host path mounted at `target` in a service."""
    for src, tgt, _ in mounts(svc):
        if tgt == target:
            path = bind_source(src)
            assert path is not None, f"{target} is a named volume, not a file of the repo"
            return path
    raise AssertionError(f"nothing is mounted at {target}")


def listen_port(name: str) -> int:
    """The port service `name` listens on inside the compose network."""
    svc = services()[name]
    if name in PORT_ENV:
        settings = importlib.import_module(f"{name}.settings").Settings
        return int(env(svc).get(PORT_ENV[name]) or settings.model_fields["port"].default)
    opt, default = UPSTREAM_PORTS[name]
    given = flag(command(svc), opt) if opt else None
    return int(given.rsplit(":", 1)[-1]) if given else default


def host_port(address: str) -> tuple[str, int]:
    """(host, port) of a URL or a ``host:port``."""
    parts = urlsplit(address if "//" in address else f"//{address}")
    assert parts.hostname and parts.port, f"{address} names no host and port"
    return parts.hostname, parts.port


def assert_names_service(address: str, service: str, where: str) -> None:
    host, port = host_port(address)
    assert host == service, f"{where}: {address} should name the {service} service"
    assert host in services(), f"{where}: {host} is not a compose service"
    assert port == listen_port(service), f"{where}: {address}, but {service} listens on {listen_port(service)}"


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        buf += line.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        instr, _, args = buf.strip().partition(" ")
        out.append((instr.upper(), args.strip()))
        buf = ""
    assert not buf, "Dockerfile ends in a continuation line"
    return out


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps `path` (relative, posix) out of the build context.

    Docker's rules: patterns in order, the last match wins, ``!`` re-includes, a pattern matching a parent
    directory matches everything below it, ``**`` spans directories.
    """
    def regex(pattern: str) -> re.Pattern[str]:
        out = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**", i):
                out += ".*"
                i += 2
                if pattern.startswith("/", i):
                    out += "/?"  # "**/x" also matches "x"
                    i += 1
                continue
            c = pattern[i]
            out += "[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c)
            i += 1
        return re.compile(out)

    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pat = regex(line.lstrip("!").strip("/"))
        if any(pat.fullmatch(p) for p in prefixes):
            ignored = not negate
    return ignored


def compose_argv() -> list[str]:
    """A Docker Compose that parses the file here without a daemon: the docker CLI's compose plugin where a
    user has one, else Debian's docker-compose (scripts/bootstrap.sh installs it)."""
    candidates: list[list[str]] = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for argv in candidates:
        r = subprocess.run([*argv, "version"], capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return argv
    pytest.fail("no Docker Compose here to check docker-compose.yml with: install Debian's docker-compose "
                "(scripts/bootstrap.sh does) or the docker compose plugin")


def run_compose(*args: str, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("FAILSLOW_", "COMPOSE_"))}
    run_env.update(extra_env or {})
    r = subprocess.run([*compose_argv(), "-f", str(COMPOSE_FILE), *args, "config"],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env=run_env)
    assert r.returncode == 0, f"docker compose config failed:\n{r.stderr}"
    doc: dict[str, Any] = yaml.safe_load(r.stdout)
    return doc


def compose_alertmanager_text() -> str:
    """deploy/compose/alertmanager/alertmanager.yml as generated from the shipped alertmanager.yml."""
    shipped = SHIPPED_AM.read_text()
    url = remediator_webhook(yaml.safe_load(shipped))["url"]
    port = listen_port("remediator")
    new = f"http://remediator:{port}{urlsplit(url).path}"
    assert shipped.count(f"url: {url}") == 1, "alertmanager.yml: the webhook URL should appear exactly once"
    head = ("# GENERATED from alertmanager/alertmanager.yml for docker-compose.yml; do not edit. Identical but for\n"
            "# the remediator webhook, which in compose is the remediator service instead of 127.0.0.1. After a\n"
            "# change to the shipped file: FAILSLOW_REGEN_GOLDEN=1 .venv/bin/python -m pytest -q tests/integration/test_compose.py\n"
            "#\n")
    return head + shipped.replace(f"url: {url}", f"url: {new}")


def remediator_webhook(cfg: dict[str, Any]) -> dict[str, Any]:
    hooks = [w for r in cfg["receivers"] if r["name"] == "remediator" for w in r.get("webhook_configs") or []]
    assert len(hooks) == 1, "expected exactly one remediator webhook"
    hook: dict[str, Any] = hooks[0]
    return hook


# ---------------------------------------------------------------------------------------------- the file
def test_docker_compose_accepts_the_file() -> None:
    doc = run_compose("--profile", "node-agent")
    assert set(doc["services"]) >= {"prometheus", "alertmanager", "redis", "grafana", *FAILSLOW_SERVICES}
    rem = doc["services"]["remediator"]["environment"]
    assert rem["FAILSLOW_REMEDIATOR_MODE"] == "dry-run", "the remediator must default to dry-run"
    # the node agent is opt-in (compose v1's `config` prints every service whatever the profile: read the file)
    assert compose()["services"]["exporter"].get("profiles") == ["node-agent"], "the node agent is opt-in"
    run_compose()
    auto = run_compose(extra_env={"FAILSLOW_REMEDIATOR_MODE": "auto"})
    assert auto["services"]["remediator"]["environment"]["FAILSLOW_REMEDIATOR_MODE"] == "auto"


def test_every_mounted_host_path_is_in_the_repo() -> None:
    doc = compose()
    declared = set(doc.get("volumes") or {})
    for name, svc in services().items():
        for src, tgt, _ in mounts(svc):
            path = bind_source(src)
            if path is None:
                assert src in declared, f"{name}: volume {src} is not declared"
                continue
            assert path.is_relative_to(REPO), f"{name}: {src} lies outside the repository"
            assert path.exists(), f"{name}: {src} (mounted at {tgt}) does not exist"
    for name, secret in (doc.get("secrets") or {}).items():
        path = (COMPOSE_FILE.parent / secret["file"]).resolve()
        # The secret itself is the user's to create; where it goes must exist and never be committed.
        assert path.is_relative_to(REPO) and path.parent.is_dir(), f"secret {name}: {path.parent} is missing"
        r = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=REPO, capture_output=True)
        assert r.returncode == 0, f"secret {name}: {path.relative_to(REPO)} is not git-ignored"
        assert dockerignored(str(path.relative_to(REPO))), f"secret {name} would enter the image build context"


def test_failslow_services_run_one_image_built_from_the_dockerfile() -> None:
    svcs = services()
    images = set()
    for name in FAILSLOW_SERVICES:
        svc = svcs[name]
        build = svc.get("build")
        assert isinstance(build, dict), f"{name}: must be built here"
        assert (COMPOSE_FILE.parent / build["context"]).resolve() == REPO, f"{name}: build context is not the repo"
        assert (REPO / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE, f"{name}: not ./Dockerfile"
        assert "entrypoint" not in svc, f"{name}: the image's entrypoint is `failslow`"
        images.add(svc.get("image"))
        cmd = command(svc)
        assert cmd and cmd[0] in COMMANDS, f"{name}: `failslow {' '.join(cmd)}` is no subcommand"
        assert cmd[0] == name, f"{name}: runs `failslow {cmd[0]}`"
    assert len(images) == 1 and None not in images, f"one image for every failslow service, got {images}"
    for name, svc in svcs.items():
        if name not in FAILSLOW_SERVICES:
            assert "build" not in svc and svc.get("image"), f"{name}: an upstream image"


def test_dockerfile() -> None:
    instrs = dockerfile()
    froms = [a for i, a in instrs if i == "FROM"]
    assert froms == ["python:3.11-slim"], froms
    entry = [a for i, a in instrs if i == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["failslow"], "ENTRYPOINT must be the exec form [\"failslow\"]"
    users = [a for i, a in instrs if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the services must not run as root"
    runs = " ".join(a for i, a in instrs if i == "RUN")
    assert re.search(r"pip install \.(\s|$)", runs), "the project must be installed with `pip install .`"
    assert "[testbed]" not in runs and "torch" not in runs, "the services need no torch"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "torch" not in " ".join(project["project"]["dependencies"]), "torch crept into the core dependencies"
    copied: set[str] = set()
    for instr, args in instrs:
        if instr in ("COPY", "ADD"):
            assert not args.startswith("--from"), "single-stage build expected"
            *sources, _dest = shlex.split(args)
            for src in sources:
                assert (REPO / src).exists(), f"COPY {src}: no such path"
                assert not dockerignored(src), f"COPY {src}: excluded by .dockerignore"
                copied.add(src.strip("./"))
    # Every package the wheel is meant to hold must reach the build.
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()
                and any(fnmatch.fnmatch(p.name, pat) for pat in patterns)}
    assert packages and packages <= copied, f"packages not copied: {sorted(packages - copied)}"
    assert {"pyproject.toml", "README.md"} <= copied


def test_dockerignore_keeps_state_and_secrets_out() -> None:
    for path in (".venv/bin/python", ".git/config", "deploy/compose/secrets/remediator.token", "shim/build/x.so",
                 "failslow/record/__pycache__/reader.cpython-311.pyc", "failslow.egg-info/PKG-INFO", "tests/conftest.py"):
        assert dockerignored(path), f"{path} would enter the build context"
    for path in ("pyproject.toml", "README.md", "failslow/record/reader.py", "remediator/adapters/command.py"):
        assert not dockerignored(path), f"{path} is needed by the build"


# ---------------------------------------------------------------------------------------------- addresses
def test_compose_alertmanager_is_the_shipped_one_but_for_the_webhook_url() -> None:
    expected = compose_alertmanager_text()
    if REGEN:
        COMPOSE_AM.write_text(expected)
    assert COMPOSE_AM.read_text() == expected, (
        "deploy/compose/alertmanager/alertmanager.yml differs from the shipped file beyond the webhook URL; "
        "FAILSLOW_REGEN_GOLDEN=1 regenerates it")
    shipped, ours = yaml.safe_load(SHIPPED_AM.read_text()), yaml.safe_load(COMPOSE_AM.read_text())
    url = remediator_webhook(ours)["url"]
    assert_names_service(url, "remediator", "compose alertmanager.yml webhook")
    shipped_url = remediator_webhook(shipped)["url"]
    assert urlsplit(url).path == urlsplit(shipped_url).path == "/api/v1/alerts"
    # The shipped file calls 127.0.0.1 on the port a remediator listens on by default, compose on the same.
    assert host_port(shipped_url)[1] == Settings.model_fields["port"].default == listen_port("remediator")
    remediator_webhook(shipped)["url"] = url
    assert shipped == ours
    am = services()["alertmanager"]
    cfg = flag(command(am), "--config.file")
    assert cfg and mount_of(am, cfg) == COMPOSE_AM, "Alertmanager must read the compose alertmanager.yml"
    assert env(services()["remediator"])["FAILSLOW_REMEDIATOR_HOST"] == "0.0.0.0", \
        "the remediator must listen beyond its own container's loopback"


def test_alertmanager_sends_the_token_the_remediator_checks() -> None:
    svcs = services()
    am, rem = svcs["alertmanager"], svcs["remediator"]
    cfg = flag(command(am), "--config.file")
    assert cfg
    cred = remediator_webhook(yaml.safe_load(COMPOSE_AM.read_text()))["http_config"]["authorization"]
    wanted = str(PurePosixPath(cfg).parent / cred["credentials_file"])  # resolved next to the config

    def secret_paths(svc: dict[str, Any]) -> dict[str, str]:
        out = {}
        for s in svc.get("secrets") or []:
            src, tgt = (s, s) if isinstance(s, str) else (s["source"], s.get("target", s["source"]))
            out[src] = tgt if tgt.startswith("/") else f"/run/secrets/{tgt}"
        return out

    am_secrets, rem_secrets = secret_paths(am), secret_paths(rem)
    (am_source,) = [s for s, p in am_secrets.items() if p == wanted]
    assert rem_secrets.get(am_source) == env(rem)["FAILSLOW_REMEDIATOR_TOKEN_FILE"], \
        "the remediator must read the same secret Alertmanager sends"
    assert "file" in compose()["secrets"][am_source]


def test_prometheus_targets_name_services_on_their_ports() -> None:
    prom = services()["prometheus"]
    cfg_path = flag(command(prom), "--config.file")
    assert cfg_path
    cfg_dir = PurePosixPath(cfg_path).parent
    assert mount_of(prom, str(cfg_dir)) == REPO / "prometheus", "Prometheus must read the shipped prometheus/"
    assert mount_of(prom, str(cfg_dir / "targets")) == COMPOSE_TARGETS, "compose targets must overlay targets/"
    cfg = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text())
    globs = [f for sc in cfg["scrape_configs"] for sd in sc.get("file_sd_configs", []) for f in sd["files"]]
    globs += [f for am in cfg["alerting"]["alertmanagers"] for sd in am.get("file_sd_configs", [])
              for f in sd["files"]]
    ours = sorted(p.name for p in COMPOSE_TARGETS.glob("*.json"))
    assert ours == sorted(p.name for p in (REPO / "prometheus" / "targets").glob("*.json")), \
        "compose must provide every target file the shipped configuration has"
    for pattern in globs:
        assert pattern.startswith("targets/"), pattern
        assert fnmatch.filter(ours, pattern.removeprefix("targets/")), f"no compose target file for {pattern}"
    for name in ours:
        groups = json.loads((COMPOSE_TARGETS / name).read_text())
        assert isinstance(groups, list) and groups, f"{name}: a non-empty list of target groups"
        service = name.removesuffix(".json").split("-")[0]  # exporter-<node>.json: more node agents
        for g in groups:
            assert set(g) <= {"targets", "labels"} and g["targets"], f"{name}: {g}"
            for t in g["targets"]:
                assert_names_service(t, service, f"targets/{name}")


def test_service_urls_name_services_on_their_ports() -> None:
    svcs = services()
    for name, prefix in (("detector", "FAILSLOW_DETECTOR_"), ("remediator", "FAILSLOW_REMEDIATOR_")):
        e = env(svcs[name])
        assert_names_service(e[prefix + "PROMETHEUS_URL"], "prometheus", f"{name} PROMETHEUS_URL")
        assert_names_service(e[prefix + "REDIS_URL"], "redis", f"{name} REDIS_URL")
    assert env(svcs["detector"]).get("FAILSLOW_DETECTOR_ADDRESS", "0.0.0.0") == "0.0.0.0"
    ds = yaml.safe_load((REPO / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    for d in ds["datasources"]:
        assert_names_service(d["url"], "prometheus", f"grafana datasource {d['name']}")
    dash = yaml.safe_load((REPO / "grafana" / "provisioning" / "dashboards" / "failslow.yml").read_text())
    for prov in dash["providers"]:
        assert mount_of(svcs["grafana"], prov["options"]["path"]) == REPO / "grafana" / "dashboards"
    for name, svc in svcs.items():
        for p in svc.get("ports") or []:
            container = int(str(p).split(":")[-1].split("/")[0])
            assert container == listen_port(name), f"{name}: publishes {container}, listens on {listen_port(name)}"
        for dep in svc.get("depends_on") or []:
            assert dep in svcs, f"{name} depends on unknown {dep}"


def test_remediator_and_redis_settings() -> None:
    svcs = services()
    e = env(svcs["remediator"])
    assert e["FAILSLOW_REMEDIATOR_MODE"] == "dry-run"
    cfg = read_config(mount_of(svcs["remediator"], e["FAILSLOW_REMEDIATOR_CONFIG"]))
    assert "restart" in cfg.policy.approval
    redis_cmd = command(svcs["redis"])
    assert flag(redis_cmd, "--appendonly") == "yes", "the remediator's Redis must persist every write"
    assert any(tgt == "/data" for _, tgt, _ in mounts(svcs["redis"])), "Redis data must outlive the container"


def test_amtool_accepts_the_compose_alertmanager_config(tmp_path: Path) -> None:
    amtool = require_binary(AMTOOL)
    shutil.copy(COMPOSE_AM, tmp_path / "alertmanager.yml")
    (tmp_path / "remediator.token").write_text("t0ken\n")
    r = subprocess.run([amtool, "check-config", str(tmp_path / "alertmanager.yml")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
