"""Static checks of the deployment files: Dockerfile, docker-compose.yml and deploy/.

Nothing here starts a container (there may be no Docker engine): the files are parsed and
cross-checked against each other and against the code (settings fields, metric names, CLI
subcommands). promtool, amtool and kubectl are used when they are on PATH and skipped with a
reason otherwise (``make promtool`` installs promtool); the Kubernetes schema check runs when
the ``kubernetes-validate`` package is importable.

``promql_metric_names(expr)`` is reusable: it returns the metric names a PromQL expression
(or a Grafana ``label_values(...)`` query) selects.
"""

from __future__ import annotations

import copy
import fnmatch
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml

from service.metrics import metric_names
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
README = ROOT / "README.md"
PROM_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
RULES = DEPLOY / "prometheus" / "rules" / "cusp.rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "rules" / "cusp.rules.test.yml"
ALERTMANAGER = DEPLOY / "alertmanager" / "alertmanager.yml"
GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "cusp.json"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "cusp.yml"
K8S = DEPLOY / "k8s"

#: `cusp` subcommands a deployment may run (console script `cusp`, module service.cli).
CLI_SUBCOMMANDS = {"serve", "worker", "feed-demo"}
#: Third-party images the compose file may use (repository without tag).
KNOWN_IMAGES = {"redis", "prom/prometheus", "prom/alertmanager", "grafana/grafana"}
SETTINGS_ENV = {"CUSP_" + name.upper() for name in Settings.model_fields}
#: Kubernetes versions whose bundled schemas the manifests must satisfy (kubernetes-validate).
K8S_VERSIONS = ("1.27.0", "1.33.0")


# ----------------------------------------------------------------------------- helpers

_PROMQL_WORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2", "start", "end",
}  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (also Grafana's ``label_values(m, l)``).

    Strings, label matchers ``{...}``, ranges ``[...]`` and label lists of ``by``/``without``/
    ``on``/``ignoring``/``group_left``/``group_right`` are removed first; what is left that
    looks like an identifier and is not followed by ``(`` (a function or aggregation) or a
    keyword is a metric name. Grafana variables (``$stream``, ``$__rate_interval``) and numbers
    or durations (``1e3``, ``5m``) are not names.
    """
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    s = re.sub(r"\{[^{}]*\}", " ", s)
    s = re.sub(r"\[[^\[\]]*\]", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", s)
    # Grafana template queries: label_values(metric, label) -> metric; label_values(label) -> nothing
    s = re.sub(r"\blabel_values\(\s*([^,()]*?)\s*,\s*[A-Za-z_]\w*\s*\)", r" \1 ", s)
    s = re.sub(r"\blabel_values\(\s*[A-Za-z_]\w*\s*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w:.$])([A-Za-z_:][A-Za-z0-9_:]*)\b(?!\s*\()", s):
        name = m.group(1)
        if name.lower() not in _PROMQL_WORDS:
            names.add(name)
    return names


def load_yaml(path: Path):
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def load_yaml_docs(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as fh:
        return [d for d in yaml.safe_load_all(fh) if d]


def compose() -> dict:
    return load_yaml(COMPOSE)


def services() -> dict[str, dict]:
    return compose()["services"]


def is_cusp_service(svc: dict) -> bool:
    return "build" in svc or str(svc.get("image", "")).split(":")[0] == "cusp"


def as_argv(command) -> list[str]:
    if command is None:
        return []
    return list(command) if isinstance(command, list) else shlex.split(command)


def compose_env(svc: dict) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): ("" if v is None else str(v)) for k, v in env.items()}


def interpolate(value: str) -> str:
    """Compose-style ${VAR:-default} / ${VAR-default} / ${VAR} with nothing set: the default."""
    return re.sub(r"\$\{[A-Za-z_]\w*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def bind_mounts(svc: dict) -> list[tuple[str, str]]:
    """(host source, container target) of every bind mount of a compose service."""
    out = []
    for vol in svc.get("volumes") or []:
        if isinstance(vol, dict):
            if vol.get("type") == "bind":
                out.append((vol["source"], vol["target"]))
            continue
        parts = vol.split(":")
        if len(parts) >= 2 and parts[0].startswith((".", "/", "~")):
            out.append((parts[0], parts[1]))
    return out


def named_volumes(svc: dict) -> list[str]:
    out = []
    for vol in svc.get("volumes") or []:
        if isinstance(vol, dict):
            if vol.get("type") == "volume":
                out.append(vol["source"])
            continue
        parts = vol.split(":")
        if len(parts) >= 2 and not parts[0].startswith((".", "/", "~")):
            out.append(parts[0])
    return out


def host_path_of(svc: dict, container_path: str) -> Path | None:
    """The host path a container path of a compose service maps to through its bind mounts."""
    target = PurePosixPath(container_path)
    best = None
    for src, dst in bind_mounts(svc):
        dstp = PurePosixPath(dst)
        if target == dstp or dstp in target.parents:
            if best is None or len(dstp.parts) > len(PurePosixPath(best[1]).parts):
                best = (src, dst)
    if best is None:
        return None
    rel = target.relative_to(PurePosixPath(best[1]))
    return (ROOT / best[0] / rel).resolve()


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    logical, buf = [], ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            logical.append(buf.strip())
        buf = ""
    out = []
    for line in logical:
        instr, _, args = line.partition(" ")
        out.append((instr.upper(), args.strip()))
    return out


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instr, args in dockerfile_instructions():
        if instr == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instr, args))
    return stages


def dockerfile_env(instructions) -> dict[str, str]:
    env = {}
    for instr, args in instructions:
        if instr != "ENV":
            continue
        tokens = shlex.split(args)
        if tokens and "=" not in tokens[0]:  # legacy `ENV KEY value`
            env[tokens[0]] = " ".join(tokens[1:])
            continue
        for tok in tokens:
            key, _, value = tok.partition("=")
            env[key] = value
    return env


def exec_form(args: str) -> list[str]:
    args = args.strip()
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def k8s_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def k8s_docs() -> list[tuple[Path, dict]]:
    return [(p, d) for p in k8s_files() for d in load_yaml_docs(p)]


def k8s_by_kind(kind: str) -> list[dict]:
    return [d for _, d in k8s_docs() if d.get("kind") == kind]


def pod_templates() -> list[tuple[str, dict]]:
    """(workload name, pod template) of every workload."""
    out = []
    for _, d in k8s_docs():
        if d.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            out.append((d["metadata"]["name"], d["spec"]["template"]))
    return out


def containers(template: dict) -> list[dict]:
    spec = template["spec"]
    return list(spec.get("initContainers") or []) + list(spec["containers"])


def container_ports(template: dict) -> tuple[set[int], set[str]]:
    numbers, names = set(), set()
    for c in containers(template):
        for p in c.get("ports") or []:
            numbers.add(int(p["containerPort"]))
            if "name" in p:
                names.add(p["name"])
    return numbers, names


def port_ok(port, template: dict) -> bool:
    numbers, names = container_ports(template)
    return port in names if isinstance(port, str) and not port.isdigit() else int(port) in numbers


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def used_cusp_commands() -> list[list[str]]:
    """Every `cusp ...` command line the Dockerfile, compose file and k8s manifests run."""
    cmds = []
    for stage in dockerfile_stages():
        for instr, args in stage:
            if instr in ("CMD", "ENTRYPOINT"):
                cmds.append(exec_form(args))
    for svc in services().values():
        cmds.append(as_argv(svc.get("command")))
    for _, template in pod_templates():
        for c in containers(template):
            cmds.append(list(c.get("command") or []) + list(c.get("args") or []))
    return [c for c in cmds if c and c[0] == "cusp"]


def rule_exprs() -> list[str]:
    out = []
    for group in load_yaml(RULES)["groups"]:
        for rule in group["rules"]:
            out.append(rule["expr"])
    return out


def alerts() -> dict[str, dict]:
    return {r["alert"]: r for g in load_yaml(RULES)["groups"] for r in g["rules"] if "alert" in r}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def dashboard_panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels") or [])
    return out


def dashboard_exprs(dash: dict) -> list[str]:
    exprs = []
    for p in dashboard_panels(dash):
        for t in p.get("targets") or []:
            if t.get("expr"):
                exprs.append(t["expr"])
    for a in dash.get("annotations", {}).get("list", []):
        if a.get("expr"):
            exprs.append(a["expr"])
        if isinstance(a.get("target"), dict) and a["target"].get("expr"):
            exprs.append(a["target"]["expr"])
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if v.get("type") == "query" and q:
            exprs.append(q)
    return exprs


def provisioned_datasource_uid() -> str:
    (ds,) = [d for d in load_yaml(DATASOURCES)["datasources"] if d["type"] == "prometheus"]
    return ds["uid"]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not on PATH (install it: `make promtool`, or apt-get install prometheus)")
    return path


def run(cmd: list[str], cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------ promql_metric_names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("cusp_redis_up == 0", {"cusp_redis_up"}),
        ('up{job=~"cusp.*"} == 0', {"up"}),
        ('sum by (stream, model) (increase(cusp_changepoints_total{stream="cusp_x"}[5m])) > 0', {"cusp_changepoints_total"}),
        (
            "histogram_quantile(0.99, sum by (le) (rate(cusp_chunk_processing_seconds_bucket[$__rate_interval])))",
            {"cusp_chunk_processing_seconds_bucket"},
        ),
        ("a / on(stream) group_left(model) b offset 5m > 1e3", {"a", "b"}),
        ("sum(x) without (instance) unless absent(y) or vector(1)", {"x", "y"}),
        ('label_values(cusp_log_evidence_nats{stream=~"$stream"}, model)', {"cusp_log_evidence_nats"}),
        ("label_values(stream)", set()),
        ("max_over_time(cusp_annealing_steps_last[30m:1m]) - 4 * clamp_min(z, 0.1)", {"cusp_annealing_steps_last", "z"}),
    ],
)
def test_promql_metric_names(expr, names):
    assert promql_metric_names(expr) == names


# ---------------------------------------------------------------------------- compose


def test_compose_has_the_services():
    svcs = services()
    assert {"redis", "api", "worker", "prometheus", "alertmanager", "grafana", "feeder"} <= set(svcs)
    redis_cmd = as_argv(svcs["redis"]["command"])
    for flag, value in (("--appendonly", "yes"), ("--appendfsync", "everysec")):
        assert redis_cmd[redis_cmd.index(flag) + 1] == value
    assert any(dst == "/data" for dst in [v.split(":")[1] for v in svcs["redis"]["volumes"]])
    assert svcs["worker"]["deploy"]["replicas"] == 2
    assert compose_env(svcs["api"])["CUSP_WORKERS"] == "0"
    for name in ("api", "worker"):
        assert compose_env(svcs[name])["CUSP_REDIS_URL"] == "redis://redis:6379/0"
    assert svcs["feeder"]["restart"] == "no"
    assert svcs["feeder"]["depends_on"]["api"]["condition"] == "service_healthy"


def test_compose_bind_mounts_exist_and_volumes_are_declared():
    declared = set((compose().get("volumes") or {}).keys())
    for name, svc in services().items():
        for src, _ in bind_mounts(svc):
            assert (ROOT / src).exists(), f"{name}: bind-mounted {src} does not exist"
        for vol in named_volumes(svc):
            assert vol in declared, f"{name}: volume {vol} is not declared under top-level volumes"


def test_compose_depends_on():
    svcs = services()
    for name, svc in svcs.items():
        deps = svc.get("depends_on") or {}
        if isinstance(deps, list):
            deps = {d: {"condition": "service_started"} for d in deps}
        for dep, spec in deps.items():
            assert dep in svcs, f"{name} depends on unknown service {dep}"
            cond = spec.get("condition", "service_started")
            assert cond in ("service_started", "service_healthy", "service_completed_successfully")
            if cond == "service_healthy":
                hc = svcs[dep].get("healthcheck")
                assert hc and not hc.get("disable") and hc.get("test"), f"{name} waits for {dep} healthy, which has no healthcheck"


def test_compose_healthchecks_of_long_running_services():
    for name, svc in services().items():
        if svc.get("restart") == "no":
            continue
        hc = svc.get("healthcheck") or {}
        assert hc.get("test") and not hc.get("disable"), f"{name} has no healthcheck"
        test = " ".join(as_argv(hc["test"]))
        if is_cusp_service(svc):
            assert "curl" not in test and "python" in test, f"{name}: the slim image has no curl"


def test_compose_host_ports_unique():
    seen: dict[str, str] = {}
    for name, svc in services().items():
        for port in svc.get("ports") or []:
            if isinstance(port, dict):
                host = str(port.get("published"))
            else:
                parts = str(port).split(":")
                assert len(parts) >= 2, f"{name}: publish {port} with an explicit host port"
                host = parts[-2]
            assert host not in seen, f"host port {host} published by both {seen[host]} and {name}"
            seen[host] = name
    assert {"8000", "9090", "3000"} <= set(seen)


def test_compose_commands_are_cusp_subcommands_or_known_images():
    for name, svc in services().items():
        if is_cusp_service(svc):
            argv = as_argv(svc.get("command"))
            assert argv[:1] == ["cusp"] and len(argv) > 1, f"{name}: command must be `cusp <subcommand> ...`"
            assert argv[1] in CLI_SUBCOMMANDS, f"{name}: unknown cusp subcommand {argv[1]}"
        else:
            repo = str(svc["image"]).rsplit(":", 1)[0] if ":" in str(svc["image"]).split("/")[-1] else str(svc["image"])
            assert repo in KNOWN_IMAGES, f"{name}: unexpected image {svc['image']}"
    svcs = services()
    assert as_argv(svcs["api"]["command"])[:2] == ["cusp", "serve"]
    assert as_argv(svcs["worker"]["command"]) == ["cusp", "worker", "--metrics-port", "9100"]
    assert as_argv(svcs["feeder"]["command"]) == ["cusp", "feed-demo", "--url", "http://api:8000"]


def test_compose_grafana_is_wired_to_the_provisioning_and_home_dashboard():
    svc = services()["grafana"]
    env = compose_env(svc)
    assert env.get("GF_AUTH_ANONYMOUS_ENABLED") == "true" or env.get("GF_SECURITY_ADMIN_PASSWORD")
    assert host_path_of(svc, "/etc/grafana/provisioning") == (GRAFANA / "provisioning").resolve()
    home = host_path_of(svc, env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert home == DASHBOARD.resolve()
    for provider in load_yaml(DASHBOARD_PROVIDERS)["providers"]:
        path = host_path_of(svc, provider["options"]["path"])
        assert path is not None and path.is_dir() and any(path.glob("*.json"))
    for ds in load_yaml(DATASOURCES)["datasources"]:
        host = re.match(r"https?://([^:/]+)", ds["url"]).group(1)
        assert host in services(), f"datasource url {ds['url']} names no compose service"


def test_compose_prometheus_mounts_config_and_rules():
    svc = services()["prometheus"]
    args = as_argv(svc.get("command"))
    config = next(a.split("=", 1)[1] for a in args if a.startswith("--config.file="))
    assert host_path_of(svc, config) == PROM_CONFIG.resolve()
    prom = load_yaml(PROM_CONFIG)
    config_dir = PurePosixPath(config).parent
    matched = []
    for pattern in prom["rule_files"]:
        host = host_path_of(svc, str(config_dir / pattern))
        assert host is not None, f"rule_files {pattern} is not mounted into the container"
        matched += sorted(host.parent.glob(host.name))
    assert RULES.resolve() in matched
    assert RULES_TEST.resolve() not in matched, "the promtool test file must not be loaded as rules"
    am = services()["alertmanager"]
    am_config = next(a.split("=", 1)[1] for a in as_argv(am["command"]) if a.startswith("--config.file="))
    assert host_path_of(am, am_config) == ALERTMANAGER.resolve()


def test_prometheus_scrapes_the_compose_services():
    prom = load_yaml(PROM_CONFIG)
    svcs = services()
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    api_port = compose_env(svcs["api"]).get("CUSP_PORT", "8000")
    assert jobs["cusp-api"]["static_configs"][0]["targets"] == [f"api:{api_port}"]
    (dns,) = jobs["cusp-worker"]["dns_sd_configs"]
    assert dns["names"] == ["worker"] and dns["type"] == "A"
    worker_cmd = as_argv(svcs["worker"]["command"])
    assert str(dns["port"]) == worker_cmd[worker_cmd.index("--metrics-port") + 1]
    for am in prom["alerting"]["alertmanagers"]:
        for sc in am["static_configs"]:
            for t in sc["targets"]:
                assert t.split(":")[0] in svcs
    for job in prom["scrape_configs"]:
        for sc in job.get("static_configs") or []:
            for t in sc["targets"]:
                host = t.split(":")[0]
                assert host in svcs or host == "localhost", f"{job['job_name']}: {t} names no compose service"


# --------------------------------------------------------------------------- settings


def _deploy_texts() -> list[tuple[str, str]]:
    paths = [DOCKERFILE, COMPOSE, *sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.suffix in (".yml", ".yaml", ".md", ".json"))]
    return [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in paths]


def set_cusp_env() -> dict[str, set[str]]:
    """Every CUSP_* variable the deployment sets -> where."""
    where: dict[str, set[str]] = {}
    for name, svc in services().items():
        for key in compose_env(svc):
            where.setdefault(key, set()).add(f"docker-compose.yml:{name}")
    for key in dockerfile_env(dockerfile_instructions()):
        where.setdefault(key, set()).add("Dockerfile")
    for wname, template in pod_templates():
        for c in containers(template):
            for e in c.get("env") or []:
                where.setdefault(e["name"], set()).add(f"k8s:{wname}")
    return {k: v for k, v in where.items() if k.startswith("CUSP_")}


def test_every_cusp_env_var_is_a_setting():
    unknown = {k: sorted(v) for k, v in set_cusp_env().items() if k not in SETTINGS_ENV}
    assert not unknown, f"not fields of service.settings.Settings: {unknown}"
    # also every CUSP_* name merely mentioned in the deployment files and docs
    mentioned = {}
    for path, text in _deploy_texts():
        for name in re.findall(r"\bCUSP_[A-Z0-9_]+\b", text):
            if name not in SETTINGS_ENV:
                mentioned.setdefault(name, set()).add(path)
    assert not mentioned, f"unknown CUSP_* names mentioned: {mentioned}"


def test_a_cusp_variable_that_is_no_setting_is_named_and_kubernetes_service_variables_are_not():
    """A typo's setting keeps its default: `cusp serve` and `cusp worker` warn of CUSP_ variables that
    are no setting, with the nearest one. The variables Kubernetes gives every pod for each Service
    of the manifests (cusp-api: CUSP_API_SERVICE_HOST, CUSP_API_PORT_8000_TCP_ADDR, ...) are no typo."""
    from service.settings import unknown_variables

    env = {"CUSP_MAX_BODY_BYTE": "1", "CUSP_PORT": "8000", "CUSP_FROBNICATE": "1", "PATH": "/bin"}
    assert unknown_variables(env) == ["CUSP_FROBNICATE", "CUSP_MAX_BODY_BYTE (CUSP_MAX_BODY_BYTES?)"]
    injected = {}
    for svc in k8s_by_kind("Service"):
        base = svc["metadata"]["name"].upper().replace("-", "_")
        injected |= {f"{base}_SERVICE_HOST": "10.0.0.1", f"{base}_SERVICE_PORT": "1", f"{base}_PORT": "tcp://10.0.0.1:1"}
        for port in svc["spec"].get("ports", []):
            tail = f"{base}_PORT_{port['port']}_{port.get('protocol', 'TCP')}"
            injected |= {tail: "tcp://10.0.0.1:1", f"{tail}_PROTO": "tcp", f"{tail}_PORT": "1", f"{tail}_ADDR": "10.0.0.1"}
            if port.get("name"):
                injected[f"{base}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = "1"
    assert any(k.startswith("CUSP_") for k in injected) and unknown_variables(injected) == []


def _settings_from(env: dict[str, str], monkeypatch) -> Settings:
    for key in list(os.environ):
        if key.startswith("CUSP_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Settings()


def test_cusp_env_values_are_valid_settings(monkeypatch):
    base = {k: v for k, v in dockerfile_env(dockerfile_stages()[-1]).items() if k.startswith("CUSP_")}
    s = _settings_from(base, monkeypatch)
    assert s.host == "0.0.0.0" and s.port == 8000
    for name, svc in services().items():
        if is_cusp_service(svc):
            env = {k: interpolate(v) for k, v in compose_env(svc).items() if k.startswith("CUSP_")}
            s = _settings_from({**base, **env}, monkeypatch)
            if name in ("api", "worker"):
                assert s.redis_url == "redis://redis:6379/0"
    secrets = {d["metadata"]["name"]: {**(d.get("stringData") or {})} for d in k8s_by_kind("Secret")}
    for wname, template in pod_templates():
        for c in containers(template):
            env = {}
            for e in c.get("env") or []:
                if not e["name"].startswith("CUSP_"):
                    continue
                if "value" in e:
                    env[e["name"]] = e["value"]
                elif "secretKeyRef" in e.get("valueFrom", {}):
                    ref = e["valueFrom"]["secretKeyRef"]
                    env[e["name"]] = secrets[ref["name"]][ref["key"]]
            if env:
                _settings_from({**base, **env}, monkeypatch)


# -------------------------------------------------------------------------- Dockerfile


def test_dockerfile_structure():
    stages = dockerfile_stages()
    assert len(stages) >= 2, "multi-stage build expected"
    for stage in stages:
        assert re.match(r"python:\$\{PYTHON_VERSION\}-slim|python:3\.11-slim", stage[0][1]), stage[0][1]
    args: dict[str, str | None] = {}
    for instr, arg in dockerfile_instructions():
        if instr == "ARG":  # a stage re-declares a global ARG without a default to use it
            key, eq, default = arg.partition("=")
            if eq or key not in args:
                args[key] = default if eq else None
    assert args.get("PYTHON_VERSION", "3.11") == "3.11"
    final = stages[-1]
    users = [a for i, a in final if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the runtime stage must run as a non-root user"
    assert users[-1].split(":")[0] == "cusp"
    healthchecks = [a for i, a in final if i == "HEALTHCHECK"]
    assert healthchecks and "/readyz" in healthchecks[-1] and "python" in healthchecks[-1]
    assert "curl" not in healthchecks[-1] and "wget" not in healthchecks[-1]
    cmds = [exec_form(a) for i, a in final if i == "CMD"]
    assert cmds and cmds[-1] == ["cusp", "serve"]
    env = dockerfile_env(final)
    assert env.get("CUSP_HOST") == "0.0.0.0"
    assert any(i == "COPY" and "--from=" in a and "/opt/venv" in a for i, a in final)
    # build stage: torch from the PyTorch CPU index by default (a build arg switches to CUDA), then `pip install .`
    assert args.get("TORCH_INDEX_URL") == "https://download.pytorch.org/whl/cpu"
    assert args.get("TORCH_VERSION") == "2.13.0"
    runs = [a for stage in stages[:-1] for i, a in stage if i == "RUN"]
    torch_runs = [r for r in runs if "torch==" in r]
    assert torch_runs and all("--index-url ${TORCH_INDEX_URL}" in r for r in torch_runs)
    pip_dot = [k for k, r in enumerate(runs) if re.search(r"pip install (?:--\S+ )*\.(?:\s|$)", r)]
    assert pip_dot and pip_dot[0] > runs.index(torch_runs[0]), "torch must be installed before `pip install .`"
    assert any("venv" in r for r in runs)


def test_dockerfile_copies_every_package_pyproject_installs_and_imports_the_app():
    """`pip install .` in the image installs the packages pyproject.toml names that the build context
    has: each must be copied (the image had no `cusp/`, so `cusp serve` exited at start: the API
    imports cusp.Detector for POST /v1/detect), and the build imports the app, not only `service`."""
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = {pat.rstrip("*") for pat in include}
    copied = {shlex.split(a)[0].rstrip("/") for stage in dockerfile_stages() for i, a in stage if i == "COPY" and "--from=" not in a}
    assert tops <= copied, f"packages pyproject installs but the Dockerfile does not copy: {sorted(tops - copied)}"
    # every top-level package the service imports is one of them
    imported = set()
    for path in (ROOT / "service").rglob("*.py"):
        imported |= set(re.findall(r"^\s*(?:from|import) (\w+)", path.read_text(encoding="utf-8"), re.M))
    local = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert imported & local <= tops, sorted((imported & local) - tops)
    runs = " ".join(a for stage in dockerfile_stages() for i, a in stage if i == "RUN")
    assert "service.api.app" in runs and re.search(r"import [^;\n]*\bcusp\b", runs), "the build imports the app and cusp"


def test_dockerfile_copies_exist_and_are_not_dockerignored():
    ignore = [ln.strip() for ln in DOCKERIGNORE.read_text(encoding="utf-8").splitlines() if ln.strip() and not ln.startswith("#")]
    for stage in dockerfile_stages():
        for instr, args in stage:
            if instr not in ("COPY", "ADD") or "--from=" in args:
                continue
            sources = [t for t in shlex.split(args) if not t.startswith("--")][:-1]
            for src in sources:
                if src == "README.md" and not README.exists():
                    continue  # written by the lead; `docker build` needs it
                assert (ROOT / src).exists(), f"COPY {src}: missing in the build context"
                assert not any(fnmatch.fnmatch(src.rstrip("/"), pat.rstrip("/")) for pat in ignore if not pat.startswith("!")), (
                    f"COPY {src} is excluded by .dockerignore"
                )
    for needed in (".git", ".venv", ".cusp"):
        assert needed in ignore


def test_readme_documents_the_commands():
    if not README.exists():
        pytest.skip("README.md (written by the lead) does not exist yet")
    text = README.read_text(encoding="utf-8")
    commands = used_cusp_commands()
    if not any(f"cusp {argv[1]}" in text for argv in commands):
        pytest.skip(
            "README.md documents none of the deployment's commands yet ("
            + ", ".join(sorted({f"cusp {a[1]}" for a in commands}))
            + "); once one is documented, all must be"
        )
    for argv in commands:
        assert f"cusp {argv[1]}" in text, f"README.md does not document `cusp {argv[1]}`"
        for tok in argv[2:]:
            if tok.startswith("--"):
                assert tok.split("=")[0] in text, f"README.md does not document `cusp {argv[1]} {tok}`"


def test_cli_has_the_subcommands_and_flags_used():
    if not (ROOT / "service" / "cli.py").exists() and not (ROOT / "service" / "cli").is_dir():
        pytest.skip("service/cli.py is not written yet")
    wanted: dict[str, set[str]] = {}
    for argv in used_cusp_commands():
        wanted.setdefault(argv[1], set()).update(t.split("=")[0] for t in argv[2:] if t.startswith("--"))
    script = (
        "import sys\nfrom service.cli import main\n"
        f"for sub in {sorted(wanted)!r}:\n"
        "    sys.argv = ['cusp', sub, '--help']\n"
        "    print('=====', sub, flush=True)\n"
        "    try:\n        code = main()\n    except SystemExit as e:\n        code = e.code\n"
        "    sys.stderr.flush()\n"
        "    print('===== exit', code, flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:]
    sections = {sub: (text, code) for sub, text, code in re.findall(r"===== (\S+)\n(.*?)===== exit (\S+)", out.stdout, flags=re.S)}
    known = {sub for sub, (_, code) in sections.items() if code in ("0", "None")}
    if not known:
        pytest.skip(f"service.cli has none of the subcommands the deployment runs yet ({', '.join(sorted(wanted))})")
    for sub, flags in wanted.items():
        assert sub in known, f"`cusp {sub} --help` failed:\n{sections.get(sub, ('(nothing)', ''))[0][-2000:]}"
        for flag in flags:
            assert flag in sections[sub][0], f"`cusp {sub}` has no option {flag}"


# -------------------------------------------------------------- metrics in PromQL


def test_rules_and_dashboard_reference_only_exported_metrics():
    known = metric_names() | {"up"}
    exprs = [("rules", e) for e in rule_exprs()] + [("dashboard", e) for e in dashboard_exprs(dashboard())]
    assert len(exprs) > 20
    for where, expr in exprs:
        names = promql_metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - known
        assert not unknown, f"{where}: {sorted(unknown)} not exported by service.metrics (in {expr!r})"


def test_dashboard_covers_the_key_metrics():
    used = set().union(*(promql_metric_names(e) for e in dashboard_exprs(dashboard())))
    for name in (
        "cusp_log_evidence_per_observation_nats",
        "cusp_chunk_log_predictive_nats_per_observation",
        "cusp_annealing_steps_last",
        "cusp_annealing_steps_bucket",
        "cusp_effective_sample_size",
        "cusp_model_posterior_probability",
        "cusp_changepoints_total",
        "cusp_ingest_lag_chunks",
        "cusp_chunk_processing_seconds_bucket",
        "cusp_workers",
        "cusp_worker_leases",
        "cusp_redeliveries_total",
        "cusp_fenced_writes_total",
        "cusp_dead_letters_total",
        "cusp_redis_up",
    ):
        assert name in used, f"the dashboard shows no {name}"


# ---------------------------------------------------------------------------- Grafana


def _load_make_dashboard():
    spec = importlib.util.spec_from_file_location("cusp_make_dashboard", GRAFANA / "make_dashboard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dashboard_json_is_generated_from_make_dashboard():
    module = _load_make_dashboard()
    assert DASHBOARD.read_text(encoding="utf-8") == module.render(), "run python deploy/grafana/make_dashboard.py"


def test_dashboard_structure():
    dash = dashboard()
    uid = provisioned_datasource_uid()
    panels = dashboard_panels(dash)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] != "row":
            assert p["datasource"]["uid"] == uid, p["title"]
            assert p["targets"], p["title"]
            for t in p["targets"]:
                assert t["datasource"]["uid"] == uid, p["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    for name in ("stream", "model"):
        v = variables[name]
        assert v["datasource"]["uid"] == uid
        assert re.fullmatch(rf"label_values\(cusp_log_evidence_nats(\{{.*\}})?, {name}\)", v["query"])
    # panels filter by the variables
    filtered = [e for e in dashboard_exprs(dash) if "$stream" in e]
    assert len(filtered) >= 10
    annotations = [a for a in dash["annotations"]["list"] if a.get("datasource", {}).get("uid") == uid]
    assert any("changes(cusp_changepoints_total" in a["expr"] for a in annotations)
    types = {p["type"] for p in panels}
    assert {"timeseries", "stat", "heatmap"} <= types
    assert any("histogram_quantile(0.99" in e and "cusp_chunk_processing_seconds_bucket" in e for e in dashboard_exprs(dash))


def test_grafana_provisioning_files():
    ds = load_yaml(DATASOURCES)
    assert ds["apiVersion"] == 1
    (prom,) = ds["datasources"]
    assert prom["type"] == "prometheus" and prom["access"] == "proxy" and prom["url"] == "http://prometheus:9090"
    providers = load_yaml(DASHBOARD_PROVIDERS)
    assert providers["apiVersion"] == 1
    assert [p["options"]["path"] for p in providers["providers"]] == ["/var/lib/grafana/dashboards"]


# --------------------------------------------------------------------------- promtool


def test_promtool_check_config():
    out = run([promtool(), "check", "config", str(PROM_CONFIG.relative_to(ROOT))])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 rule files found" in out.stdout + out.stderr


def test_promtool_check_rules():
    out = run([promtool(), "check", "rules", str(RULES.relative_to(ROOT))])
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_test_rules():
    out = run([promtool(), "test", "rules", str(RULES_TEST.relative_to(ROOT))])
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_checks_and_tests_the_optional_rules():
    """rules/optional/ (not loaded by default: prometheus.yml loads rules/*.rules.yml) holds rules
    a user may add, e.g. an alert per model event; each is checked and unit-tested like the rest."""
    optional = sorted((RULES.parent / "optional").glob("*.rules.yml"))
    assert optional, "no optional rule files"
    for path in optional:
        out = run([promtool(), "check", "rules", str(path.relative_to(ROOT))])
        assert out.returncode == 0, out.stdout + out.stderr
        test = path.with_name(path.name.replace(".rules.yml", ".rules.test.yml"))
        assert test.is_file(), f"{test} is missing: every optional rule file has its promtool test"
        out = run([promtool(), "test", "rules", str(test.relative_to(ROOT))])
        assert out.returncode == 0, out.stdout + out.stderr


def test_dashboard_queries_are_valid_promql(tmp_path):
    """Every dashboard query, Grafana variables substituted, parses (as a recording rule for promtool)."""
    exe = promtool()
    grafana_vars = {"$__rate_interval": "1m", "$__interval_ms": "15000", "$__interval": "15s", "$__range_s": "1800", "$__range": "30m", "$stream": ".*", "$model": ".*"}
    rules = []
    for k, expr in enumerate(dashboard_exprs(dashboard())):
        if expr.startswith("label_values("):
            continue
        for var, value in grafana_vars.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"unhandled Grafana variable in {expr!r}"
        rules.append({"record": f"dashboard:query_{k}", "expr": expr})
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8")
    out = run([exe, "check", "rules", str(path)])
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_dead_letter_panels_count_a_streams_first_dead_letter(tmp_path):
    """A stream whose first chunk is dead-lettered creates the counter's series at 1: increase()
    alone read 0 on the dashboard while CuspDeadLetters fired (an operator's trial). Each dead-letter
    query, Grafana's variables substituted, evaluated by promtool on such a series: 1."""
    exe = promtool()
    subst = {"$__rate_interval": "1m", "$__interval_ms": "60000", "$__interval": "1m", "$__range_s": "1800", "$__range": "30m",
             "$stream": ".*", "$model": ".*"}
    exprs = [e for e in dashboard_exprs(dashboard()) if "cusp_dead_letters" in e]
    assert len(exprs) == 2, exprs
    rules = []
    for k, expr in enumerate(exprs):
        for var, value in subst.items():
            expr = expr.replace(var, value)
        rules.append({"record": f"dead:q{k}", "expr": expr})
    (tmp_path / "dead.rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "dead", "interval": "1m", "rules": rules}]}))
    labels = '{stream="s", model="m"}'
    test = {"rule_files": ["dead.rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        # born at 1 at 5m (its _created sample: the unix time of its birth)
        "input_series": [{"series": f"cusp_dead_letters_total{labels}", "values": "_ _ _ _ _ 1 1"},
                         {"series": f"cusp_dead_letters_created{labels}", "values": "_ _ _ _ _ 300 300"}],
        "promql_expr_test": [{"expr": f"dead:q{k}", "eval_time": "5m",
                              "exp_samples": [{"labels": f"dead:q{k}" if k == 0 else f"dead:q{k}{labels}", "value": 1}]}
                             for k in range(len(rules))],
    }]}
    (tmp_path / "dead.test.yml").write_text(yaml.safe_dump(test))
    out = run([exe, "test", "rules", "dead.test.yml"], cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_alert_rules_are_complete_and_each_has_positive_and_negative_tests():
    rules = alerts()
    assert {
        "CuspChangePointDetected", "CuspEvidenceCusp", "CuspAnnealingStepSpike", "CuspRedisDown",
        "CuspIngestLagHigh", "CuspDeadLetters", "CuspTargetDown", "CuspEvidenceUnreliable",
    } <= set(rules)  # fmt: skip
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), name
        assert rule["annotations"].get("summary") and rule["annotations"].get("description"), name
    fires, quiet = set(), set()
    for test in load_yaml(RULES_TEST)["tests"]:
        for case in test.get("alert_rule_test") or []:
            (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert set(rules) <= fires, f"alerts with no firing test: {set(rules) - fires}"
    assert set(rules) <= quiet, f"alerts with no not-firing test: {set(rules) - quiet}"
    exprs = {name: r["expr"] for name, r in rules.items()}
    assert "increase(cusp_stream_changepoints_total[5m])" in exprs["CuspChangePointDetected"]  # the stream's answer, not a model's events
    assert "stddev_over_time(cusp_chunk_log_predictive_nats_per_observation[30m])" in exprs["CuspEvidenceCusp"]
    assert "clamp_min(" in exprs["CuspEvidenceCusp"]
    assert "avg_over_time(cusp_annealing_steps_last[30m])" in exprs["CuspAnnealingStepSpike"]


def test_promtool_tests_fail_when_an_alert_breaks(tmp_path):
    """Mutation check: each alert neutralised in turn must make `promtool test rules` fail."""
    exe = promtool()
    original = load_yaml(RULES)
    procs = {}
    for name in alerts():
        mutated = copy.deepcopy(original)
        for group in mutated["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") == name:
                    rule["expr"] = "vector(1) < 0"  # never fires
        work = tmp_path / name
        work.mkdir()
        shutil.copy(RULES_TEST, work / RULES_TEST.name)
        (work / RULES.name).write_text(yaml.safe_dump(mutated, sort_keys=False), encoding="utf-8")
        procs[name] = subprocess.Popen([exe, "test", "rules", RULES_TEST.name], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for name, proc in procs.items():
        assert proc.wait(timeout=60) != 0, f"breaking {name} does not fail the promtool tests"


def test_alertmanager_config():
    cfg = load_yaml(ALERTMANAGER)
    names = {r["name"] for r in cfg["receivers"]}
    assert cfg["route"]["receiver"] in names
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.skip("amtool not on PATH (apt-get install prometheus-alertmanager); parsed only")
    out = run([amtool, "check-config", str(ALERTMANAGER.relative_to(ROOT))])
    assert out.returncode == 0, out.stdout + out.stderr


# -------------------------------------------------------------------------- Kubernetes


def test_k8s_documents_have_identity():
    docs = k8s_docs()
    assert len(docs) >= 8
    for path, d in docs:
        assert d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"), f"{path}: {d}"
    kinds = {d["kind"] for _, d in docs}
    assert {"Namespace", "Secret", "Deployment", "Service", "StatefulSet", "HorizontalPodAutoscaler", "ServiceMonitor"} <= kinds


def test_k8s_workloads():
    for _, d in k8s_docs():
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        name = d["metadata"]["name"]
        template = d["spec"]["template"]
        labels = template["metadata"]["labels"]
        assert selects(d["spec"]["selector"]["matchLabels"], labels), f"{name}: selector does not match the pod labels"
        for c in containers(template):
            assert c.get("resources", {}).get("requests"), f"{name}/{c['name']}: no resource requests"
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                p = c.get(probe)
                if not p:
                    continue
                for kind in ("httpGet", "tcpSocket", "grpc"):
                    if kind in p:
                        assert port_ok(p[kind]["port"], template), f"{name}: {probe} port {p[kind]['port']} is not a container port"
        if d["kind"] == "StatefulSet":
            svc = [s for s in k8s_by_kind("Service") if s["metadata"]["name"] == d["spec"]["serviceName"]]
            assert svc and svc[0]["spec"].get("clusterIP") == "None", f"{name}: serviceName must be a headless Service"


def test_k8s_cusp_deployments():
    deployments = {d["metadata"]["name"]: d for d in k8s_by_kind("Deployment")}
    api = deployments["cusp-api"]["spec"]["template"]
    (c,) = api["spec"]["containers"]
    assert c["command"][:2] == ["cusp", "serve"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert {e["name"]: e.get("value") for e in c["env"]}["CUSP_WORKERS"] == "0"
    worker = deployments["cusp-worker"]
    assert worker["spec"]["replicas"] == 2
    (c,) = worker["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["cusp", "worker", "--metrics-port", "9100"]
    assert 9100 in container_ports(worker["spec"]["template"])[0]
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert worker["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9100"
    env = {e["name"]: e for e in c["env"]}
    assert "secretKeyRef" in env["CUSP_REDIS_URL"]["valueFrom"]
    redis = {r["metadata"]["name"]: r for r in k8s_by_kind("StatefulSet")}
    args = redis["redis"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert redis["redis"]["spec"]["volumeClaimTemplates"]


def test_k8s_redis_with_replicas_and_sentinel():
    """The HA alternative (deploy/k8s/redis-ha/): three data nodes with persistence, a sentinel
    beside each, quorum 2, and the Secret naming them the way cusp reads (redis+sentinel://)."""
    from service.store import sentinel_spec

    (ha,) = [r for r in k8s_by_kind("StatefulSet") if r["metadata"]["name"] == "redis-ha"]
    assert ha["spec"]["replicas"] >= 3 and ha["spec"]["volumeClaimTemplates"]
    names = [c["name"] for c in ha["spec"]["template"]["spec"]["containers"]]
    assert names == ["redis", "sentinel"]
    (scripts,) = [c for c in k8s_by_kind("ConfigMap") if c["metadata"]["name"] == "redis-ha-scripts"]
    assert "--appendonly yes" in scripts["data"]["redis.sh"]
    assert "sentinel monitor cuspm $MASTER 6379 2" in scripts["data"]["sentinel.sh"]
    urls = [s["stringData"]["redis-url"] for s in k8s_by_kind("Secret") if s["metadata"]["name"] == "cusp-redis"]
    sentinel_urls = [u for u in urls if u.startswith("redis+sentinel://")]
    assert len(sentinel_urls) == 1 and sentinel_spec(sentinel_urls[0]).service == "cuspm"


def test_k8s_services_select_pods_and_ports():
    templates = pod_templates()
    for svc in k8s_by_kind("Service"):
        name = svc["metadata"]["name"]
        matching = [t for _, t in templates if selects(svc["spec"].get("selector") or {}, t["metadata"]["labels"])]
        assert matching, f"Service {name} selects no pod template"
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert all(port_ok(target, t) for t in matching), f"Service {name}: targetPort {target} missing in its pods"


def test_k8s_secret_refs_exist():
    secrets = {}
    for s in k8s_by_kind("Secret"):
        secrets[s["metadata"]["name"]] = set(s.get("data") or {}) | set(s.get("stringData") or {})
    refs = 0
    for wname, template in pod_templates():
        for c in containers(template):
            for e in c.get("env") or []:
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    refs += 1
                    assert ref["name"] in secrets, f"{wname}: Secret {ref['name']} is not in the manifests"
                    assert ref["key"] in secrets[ref["name"]], f"{wname}: Secret {ref['name']} has no key {ref['key']}"
            for ef in c.get("envFrom") or []:
                if "secretRef" in ef:
                    assert ef["secretRef"]["name"] in secrets
    assert refs >= 2


def test_k8s_autoscaler_disruption_budget_and_service_monitors():
    deployments = {d["metadata"]["name"]: d for d in k8s_by_kind("Deployment")}
    (hpa,) = k8s_by_kind("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    ref = hpa["spec"]["scaleTargetRef"]
    assert ref["kind"] == "Deployment" and ref["name"] in deployments
    assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert any(m["type"] == "Resource" and m["resource"]["name"] == "cpu" for m in hpa["spec"]["metrics"])
    # it also scales on backlog (issue 18 item 5), the recording rule the shipped rules define
    # and the adapter config serves
    [backlog] = [m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "External"]
    assert backlog in {r.get("record") for g in load_yaml(RULES)["groups"] for r in g["rules"]}
    adapter = load_yaml(K8S / "prometheus-adapter" / "rules.yaml")
    assert backlog in adapter["data"]["config.yaml"]
    # the grace outlasts the measured shutdown (cusp bench scheduling: under a second, plus the chunk in hand)
    (worker,) = [d for d in k8s_by_kind("Deployment") if d["metadata"]["name"] == "cusp-worker"]
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 30
    for pdb in k8s_by_kind("PodDisruptionBudget"):
        assert any(selects(pdb["spec"]["selector"]["matchLabels"], t["metadata"]["labels"]) for _, t in pod_templates())
    service_list = k8s_by_kind("Service")
    monitors = k8s_by_kind("ServiceMonitor")
    assert monitors
    for sm in monitors:
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        targets = [s for s in service_list if selects(sm["spec"]["selector"]["matchLabels"], s["metadata"].get("labels") or {})]
        assert targets, f"ServiceMonitor {sm['metadata']['name']} selects no Service"
        for ep in sm["spec"]["endpoints"]:
            assert all(ep["port"] in {p.get("name") for p in s["spec"]["ports"]} for s in targets)


def test_k8s_prometheusrule_is_the_rules_file():
    """The operator's PrometheusRule carries exactly the promtool-tested rules."""
    spec = importlib.util.spec_from_file_location("cusp_make_prometheusrule", K8S / "prometheus-operator" / "make_prometheusrule.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = K8S / "prometheus-operator" / "prometheusrule.yaml"
    assert path.read_text(encoding="utf-8") == module.render(), "run python deploy/k8s/prometheus-operator/make_prometheusrule.py"
    (rule,) = k8s_by_kind("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == load_yaml(RULES)["groups"]


def test_k8s_kustomizations_list_every_manifest():
    kustomizations = sorted(K8S.rglob("kustomization.yaml"))
    assert kustomizations
    listed = set()
    for k in kustomizations:
        cfg = load_yaml(k)
        for res in cfg.get("resources") or []:
            path = (k.parent / res).resolve()
            assert path.exists(), f"{k}: resource {res} does not exist"
            listed.add(path)
    missing = [str(p.relative_to(ROOT)) for p in k8s_files() if p.resolve() not in listed]
    assert not missing, f"manifests in no kustomization.yaml: {missing}"


def test_k8s_kustomize_builds():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not on PATH; kustomizations only parsed")
    for k in sorted(K8S.rglob("kustomization.yaml")):
        out = run([kubectl, "kustomize", str(k.parent.relative_to(ROOT))])
        if out.returncode != 0 and "unknown command" in out.stderr:
            pytest.skip("this kubectl has no kustomize")
        assert out.returncode == 0, out.stderr
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        assert docs and all(d["metadata"].get("namespace") == "cusp" for d in docs if d["kind"] != "Namespace")


def test_k8s_schemas():
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed (pip install kubernetes-validate)")
    checked = 0
    for path, d in k8s_docs():
        for version in K8S_VERSIONS:
            try:
                kv.validate(d, version, strict=True)
            except kv.SchemaNotFoundError:
                assert d["apiVersion"].startswith("monitoring.coreos.com/"), f"{path}: no schema for {d['apiVersion']} {d['kind']}"
                continue
            except kv.ValidationError as exc:
                pytest.fail(f"{path}: {d['kind']} {d['metadata']['name']} invalid for Kubernetes {version}: {exc.message} at {list(exc.path)}")
            checked += 1
    assert checked >= 8
