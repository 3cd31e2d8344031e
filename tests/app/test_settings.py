"""Settings from the environment, and logs that a request cannot forge."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

import app.settings as settings_module
from app.settings import Settings, available_cpus, cpu_quota, memory_limit


def test_settings_read_the_headscope_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_DEVICE", "cpu")
    monkeypatch.setenv("HEADSCOPE_DTYPE", "bfloat16")
    monkeypatch.setenv("HEADSCOPE_MODELS", f'{{"mine": "{tmp_path}"}}')
    monkeypatch.setenv("HEADSCOPE_MODELS_DIR", str(tmp_path))
    monkeypatch.setenv("HEADSCOPE_CORS_ORIGINS", '["https://a.example"]')
    monkeypatch.setenv("HEADSCOPE_MAX_TOKENS", "128")
    monkeypatch.setenv("HEADSCOPE_THREADS", "2")
    s = Settings()
    assert (s.device, s.dtype, s.max_tokens, s.threads) == ("cpu", "bfloat16", 128, 2)
    assert s.models == {"mine": tmp_path} and s.models_dir == tmp_path
    assert s.cors_origins == ["https://a.example"]
    assert Settings(_env_prefix="NOPE_").cors_origins == []  # CORS closed unless configured


def test_http_settings_read_the_environment_with_safe_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = Settings(_env_prefix="NOPE_")
    assert defaults.allowed_hosts == []  # local names and loopback only
    assert (defaults.header_timeout, defaults.body_timeout, defaults.max_connections) == (10.0, 30.0, 128)
    monkeypatch.setenv("HEADSCOPE_ALLOWED_HOSTS", '["Headscope.Example.org", "[::1]", "*.lab.example", "*"]')
    monkeypatch.setenv("HEADSCOPE_HEADER_TIMEOUT", "2.5")
    monkeypatch.setenv("HEADSCOPE_BODY_TIMEOUT", "4")
    monkeypatch.setenv("HEADSCOPE_MAX_CONNECTIONS", "16")
    s = Settings()
    assert s.allowed_hosts == ["headscope.example.org", "::1", "*.lab.example", "*"]
    assert (s.header_timeout, s.body_timeout, s.max_connections) == (2.5, 4.0, 16)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dtype", "float64"),
        ("max_tokens", 1),
        ("max_concurrency", 0),
        ("log_level", "loud"),
        ("threads", 0),
        ("allowed_hosts", ["example.org:8000"]),
        ("allowed_hosts", ["a b"]),
        ("allowed_hosts", ["x.*.example"]),
        ("allowed_hosts", ["https://example.org"]),
        ("header_timeout", 0),
        ("body_timeout", -1),
        ("max_connections", 0),
        ("max_queue", 0),
        ("load_retry_seconds", 0),
        ("malloc_arena_max", -1),
        ("dequant_cache_bytes", -1),
    ],
)
def test_bad_settings_fail_at_startup_naming_the_value(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        Settings(**{field: value})  # type: ignore[arg-type]


def test_access_log_cannot_be_forged_and_never_holds_the_text(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "my private sentence"
    with caplog.at_level(logging.INFO, logger="app"):
        client.get("/api/health%0A2026-01-01 INFO app.access: GET '/admin' 200")
        client.post("/api/attention", json={"text": secret})
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("app")]
    assert lines, "requests are logged"
    assert all("\n" not in line for line in lines)
    assert any("\\n" in line for line in lines)  # the newline is shown escaped
    assert all(secret not in line for line in lines)


def test_retry_back_off_must_be_in_order() -> None:
    with pytest.raises(ValidationError, match="load_retry_max_seconds"):
        Settings(load_retry_seconds=60, load_retry_max_seconds=10)


def fake_cgroup(tmp_path: Path, lines: list[str], files: dict[str, str]) -> dict[str, Path]:
    """A /proc/self/cgroup and a /sys/fs/cgroup tree under tmp_path."""
    (tmp_path / "self_cgroup").write_text("\n".join(lines) + "\n")
    root = tmp_path / "cgroup"
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    root.mkdir(exist_ok=True)
    return {"cgroup_root": root, "self_cgroup": tmp_path / "self_cgroup"}


@pytest.mark.parametrize(
    ("lines", "files", "quota"),
    [
        # cgroup v2 inside a container (its own namespace: the path is "/")
        (["0::/"], {"cpu.max": "150000 100000\n"}, 1.5),
        (["0::/"], {"cpu.max": "max 100000\n"}, None),
        # cgroup v2 on a host: the process's own group and its parents; the tightest wins
        (
            ["0::/system.slice/app.service"],
            {"system.slice/cpu.max": "400000 100000", "system.slice/app.service/cpu.max": "200000 100000"},
            2.0,
        ),
        (["0::/system.slice/app.service"], {"system.slice/cpu.max": "100000 100000"}, 1.0),
        # cgroup v1: the cpu controller's files; a host path missing in the container falls back to the mount
        (
            ["4:memory:/docker/abc", "3:cpu,cpuacct:/docker/abc"],
            {"cpu,cpuacct/cpu.cfs_quota_us": "300000", "cpu,cpuacct/cpu.cfs_period_us": "100000"},
            3.0,
        ),
        (["2:cpu:/"], {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
        # nothing readable: no quota
        (["0::/"], {}, None),
        (["garbage"], {"cpu.max": "150000 100000"}, None),
        (["0::/"], {"cpu.max": "lots of cpus"}, None),
    ],
)
def test_cpu_quota_reads_cgroup_v2_and_v1(
    tmp_path: Path, lines: list[str], files: dict[str, str], quota: float | None
) -> None:
    assert cpu_quota(**fake_cgroup(tmp_path, lines, files)) == quota


@pytest.mark.parametrize(
    ("lines", "files", "limit"),
    [
        (["0::/"], {}, 8 << 30),  # no limit: the machine's MemTotal
        (["0::/"], {"memory.max": "max\n"}, 8 << 30),
        (["0::/"], {"memory.max": "2147483648\n"}, 2 << 30),  # a container's --memory 2g
        (["0::/a/b"], {"a/memory.max": "1073741824", "a/b/memory.max": "4294967296"}, 1 << 30),  # tightest
        (["5:memory:/docker/x"], {"memory/memory.limit_in_bytes": "3221225472"}, 3 << 30),  # v1
        (["5:memory:/"], {"memory/memory.limit_in_bytes": "9223372036854771712"}, 8 << 30),  # v1 unlimited
        (["0::/"], {"memory.max": "lots"}, 8 << 30),
    ],
)
def test_memory_limit_reads_meminfo_and_cgroup_v2_and_v1(
    tmp_path: Path, lines: list[str], files: dict[str, str], limit: int
) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal:       {8 << 20} kB\nMemFree:        1024 kB\n")
    assert memory_limit(**fake_cgroup(tmp_path, lines, files), meminfo=meminfo) == limit


def test_the_models_budget_is_a_stated_share_or_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings_module, "memory_limit", lambda: 8 << 30)
    assert Settings().models_budget() == int((8 << 30) * settings_module.MODELS_MEMORY_SHARE) == 4 << 30
    assert Settings(models_max_bytes=123).models_budget() == 123
    assert Settings(models_max_bytes=0).models_budget() is None  # no budget
    monkeypatch.setattr(settings_module, "memory_limit", lambda: None)
    assert Settings().models_budget() is None


def test_thread_default_follows_the_container_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(64)))  # a big host
    paths = fake_cgroup(tmp_path, ["0::/"], {"cpu.max": "400000 100000"})
    assert available_cpus(**paths) == 4  # not 64
    (paths["cgroup_root"] / "cpu.max").write_text("50000 100000")
    assert available_cpus(**paths) == 1  # half a CPU still runs one thread
    (paths["cgroup_root"] / "cpu.max").write_text("max 100000")
    assert available_cpus(**paths) == 64
    (paths["cgroup_root"] / "cpu.max").write_text("400000 100000")
    monkeypatch.setattr("app.settings.available_cpus", lambda: available_cpus(**paths))
    assert Settings(max_concurrency=2).threads == 2  # 4 CPUs shared by 2 forwards


def test_store_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 34 item 3: each store's folder, and the one switch that turns discovery off."""
    defaults = Settings(_env_prefix="NOPE_")
    assert defaults.discover is True
    assert (defaults.ollama_models, defaults.lmstudio_models, defaults.hf_cache) == (None, None, None)
    monkeypatch.setenv("HEADSCOPE_DISCOVER", "false")
    monkeypatch.setenv("HEADSCOPE_OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("HEADSCOPE_LMSTUDIO_MODELS", str(tmp_path / "lmstudio"))
    monkeypatch.setenv("HEADSCOPE_HF_CACHE", str(tmp_path / "hub"))
    s = Settings()
    assert s.discover is False
    assert (s.ollama_models, s.lmstudio_models, s.hf_cache) == (
        tmp_path / "ollama",
        tmp_path / "lmstudio",
        tmp_path / "hub",
    )
    with pytest.raises(ValidationError):
        Settings(discover="perhaps")


def test_tests_never_discover_the_machines_own_stores() -> None:
    """tests/conftest.py turns discovery off for every Settings() and server a test makes."""
    assert Settings().discover is False


def test_the_dequantized_weight_budget_reaches_each_gguf_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """HEADSCOPE_DEQUANT_CACHE_BYTES and HEADSCOPE_DEQUANT_COMPILE are what every load is given; unset,
    the budget is mha's default and compiling is off."""
    import mha
    from app.service import offers as offered

    given: list[dict[str, object]] = []
    monkeypatch.setattr(mha, "load_pretrained", lambda *_, **options: given.append(options))
    file = tmp_path / "model.gguf"
    monkeypatch.setenv("HEADSCOPE_DEQUANT_CACHE_BYTES", "0")
    monkeypatch.setenv("HEADSCOPE_DEQUANT_COMPILE", "false")
    for settings, budget in ((Settings(), 0), (Settings(_env_prefix="NOPE_"), None)):
        assert settings.dequant_cache_bytes == budget
        assert settings.dequant_compile is False  # unset: eager, the faster for Q4_K_M's types
        offers = offered.find_models(settings.model_copy(update={"models": {"m": file}, "discover": False}))
        offers["m"].loader()
    assert given[0]["dequant_cache_bytes"] == 0
    assert given[1]["dequant_cache_bytes"] is None
    assert given[0]["dequant_compile"] is False and given[1]["dequant_compile"] is False


def test_each_source_of_mhas_table_is_placed_by_one_setting() -> None:
    """Adding a source is its row in mha's table and one field here: every field marked as a source's
    names a row, and every row but the bundled models (placed by two switches) has exactly one field."""
    from app.service.offers import source_fields
    from mha.loading.sources import BUNDLED, SOURCES

    marked = source_fields()
    ids = [source.id for source in SOURCES]
    assert set(marked.values()) <= set(ids), marked
    assert sorted(marked.values()) == sorted(i for i in ids if i != BUNDLED), marked


def test_discover_off_leaves_the_stores_out_and_the_folders_in(tmp_path) -> None:
    from app.service.offers import places
    from mha.loading.sources import SOURCES

    stores = {source.id for source in SOURCES if source.default is not None}
    on = places(Settings(models_dir=tmp_path, discover=True))
    off = places(Settings(models_dir=tmp_path, discover=False))
    assert stores <= set(on) and not stores & set(off), (on, off)
    assert on.keys() - stores == off.keys() and off["models_dir"] == tmp_path
