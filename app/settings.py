"""Service settings, read from the environment with the prefix ``HEADSCOPE_``.

Examples::

    HEADSCOPE_DEVICE=cpu
    HEADSCOPE_MODELS='{"gpt2": "/models/gpt2"}'    # operator allowlist: name -> checkpoint directory
    HEADSCOPE_MODELS_DIR=/models                    # every subfolder with a config.json is registered
    HEADSCOPE_CORS_ORIGINS='["https://example.org"]'
    HEADSCOPE_ALLOWED_HOSTS='["headscope.example.org"]'  # names the server answers to besides localhost
"""

from __future__ import annotations

import ipaddress
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL = "all-MiniLM-L6-v2"
# A DNS name as a Host header carries it (IDNs arrive as punycode), optionally "*." for its subdomains.
HOST_NAME = re.compile(r"(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HEADSCOPE_", extra="ignore", frozen=True)

    device: str = "auto"  # auto, cpu, cuda, cuda:N or mps; passed to mha.load_pretrained
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"  # auto lets mha pick per device
    default_model: str = DEFAULT_MODEL  # loaded at startup; must be a registered name
    models: dict[str, Path] = Field(default_factory=dict)  # operator allowlist: name -> checkpoint dir
    models_dir: Path | None = None  # scanned once at startup: each subfolder with config.json
    max_tokens: int = Field(default=512, ge=8)  # cap on tokens per request (also capped by the model)
    cache_size: int = Field(default=64, ge=0)  # LRU entries of finished answers; 0 disables the cache
    cache_max_bytes: int = Field(default=256 * 2**20, ge=0)  # the same cache, bounded in bytes too
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)  # larger request bodies get 413
    cors_origins: list[str] = Field(default_factory=list)  # empty: CORS closed
    log_level: str = "info"
    max_concurrency: int = Field(default=2, ge=1)  # forwards in flight per model (worker threads)
    # torch intra-op threads; default: the cores shared among the concurrent forwards, so 2 workers on 2
    # cores get 1 thread each (benchmarks/load.py: 1 thread 48 req/s, 2 threads 33 req/s on 2 cores).
    threads: int = Field(default_factory=lambda data: _default_threads(data["max_concurrency"]), ge=1)
    max_batch: int = Field(default=8, ge=1)  # requests waiting together run as one padded forward
    random_model: bool = True  # register "random": our layers with untrained weights
    # /api/flow refuses longer inputs (cost ~ layers·n⁴ in pure Python; ~1 s at 12 tokens, 6 layers);
    # None: mha.analysis.FLOW_MAX_TOKENS.
    flow_max_tokens: int | None = Field(default=None, ge=1)

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


def _default_threads(max_concurrency: int) -> int:
    return max(1, (os.cpu_count() or 1) // max_concurrency)


@lru_cache
def get_settings() -> Settings:
    return Settings()
