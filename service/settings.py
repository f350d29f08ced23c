"""cusp's settings: one pydantic-settings class, read from the environment (``CUSP_`` prefix).

Every setting here is documented in the README's settings table; ``Settings()`` validates
at start-up and an invalid value stops the process with a message naming the variable.
"""

from __future__ import annotations

import re

import hmac
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CUSP_", extra="ignore", frozen=True)

    redis_url: str | None = Field(
        None, description="Redis >= 6.2 URL (redis://, rediss://, unix://), or a Redis Cluster's seed nodes "
                          "(redis+cluster://[user:password@]host:port[,host:port...], rediss+cluster:// with TLS), or a "
                          "Redis with replicas under Sentinel by its sentinels and master name "
                          "(redis+sentinel://[user:password@]host:port[,host:port...]/NAME[/DB], rediss+sentinel://). "
                          "Unset: cusp starts an embedded redis-server under data_dir."
    )
    data_dir: Path = Field(Path(".cusp"), description="Where the embedded Redis keeps its data file.")
    host: str = Field("127.0.0.1", description="Address the API listens on.")
    port: int = Field(8000, ge=1, le=65535, description="Port the API listens on.")
    api_keys: str = Field(
        "",
        description="Comma-separated API keys, each 'KEY' (read and write) or 'KEY:read' (read only). Empty: open.",
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest accepted request body or WebSocket message, bytes.")
    max_chunk_rows: int = Field(10_000, ge=1, description="Most rows accepted in one chunk.")
    max_time_ahead_seconds: float = Field(
        86400.0, ge=0, description="A chunk whose rows' times run further than this ahead of the API's clock is refused (422 "
                                   "invalid_time): a stream's times must increase, so one time far in the future (a unit or "
                                   "clock mistake) would refuse every later correct one. 0: no check.")
    dedup_window: int = Field(100_000, ge=1, description="Chunks per stream whose digests are kept to recognise a resent seq after its input was trimmed.")
    max_streams: int = Field(1000, ge=1, description="Most streams that may exist at once (bounds metric label cardinality).")
    allowed_origins: str = Field(
        "", description="Comma-separated web origins (scheme://host[:port]) whose pages may open cusp's WebSockets and, "
                        "with CORS, call the API. Empty: the same origin only (the live page). '*': any (not advised).")
    cors: bool = Field(False, description="Answer CORS requests (preflights included) from CUSP_ALLOWED_ORIGINS; off: no CORS headers.")
    max_stream_bytes: int = Field(
        256 * 1024 * 1024, ge=1024 * 1024,
        description="Most Redis memory one stream's models may come to need, bytes: their states plus their full reservoirs "
                    "(reservoir_capacity rows of the model's working width); a create beyond it is refused (413).")
    max_total_stream_bytes: int = Field(
        8 * 1024**3, ge=0,
        description="Most Redis memory all streams' models together may come to need, bytes (each counted as for "
                    "CUSP_MAX_STREAM_BYTES); a create beyond it is refused (413) before anything is stored. 0: no cap.")
    lease_seconds: float = Field(10.0, gt=0.5, le=3600, description="How long a worker's lease on a stream x model lasts without renewal.")
    workers: int = Field(1, ge=0, le=64, description="Worker processes that `cusp serve` starts and supervises (0: API only).")
    worker_stall_seconds: float = Field(
        120.0, gt=0, le=86400,
        description="A worker's /healthz answers 503 when its loop has not completed a step (a poll, a chunk) for this long; "
                    "above the slowest chunk's processing time.")
    ready_needs_workers: bool | None = Field(
        None, description="Whether the API's /readyz also needs a worker that made progress within a lease. "
                          "Unset: only under `cusp serve` with worker processes (an API-only process stays ready without workers: "
                          "ingest is durable, and the workers' own /healthz reports them).")
    worker_id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$",
                                  description="This worker's name in the registry and on its leases (default: host:pid:random).")
    worker_warm_bytes: int = Field(2**31, ge=0, le=2**50, description=(
        "Most memory, bytes, a worker keeps its pairs' states, reservoirs and detector data in between chunks: beyond it the "
        "least recently used pairs are let cool (their lease kept) and reloaded from Redis when they next have work. 0: no limit."))
    max_attempts: int = Field(3, ge=1, le=100, description="Attempts at a chunk that makes a model fail before it is dead-lettered.")
    result_maxlen: int = Field(200_000, ge=100, description="Approximate cap on each result stream's length (XADD MAXLEN ~).")
    changepoint_maxlen: int = Field(10_000, ge=100, description="Approximate cap on each stream's change-point store "
                                    "(each model's events and the stream's; kept apart from the results, so result "
                                    "trimming does not lose them).")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")
    # read by models/native.py from the environment directly (the models package does not
    # depend on the service); declared here so that a bad value stops start-up
    native: bool = Field(True, description="Use the native mixture kernel (models/_native.c) where it is built; false: the numpy/torch path.")
    native_isa: int = Field(2, ge=0, le=2, description="Highest instruction set the native kernel may use: 2 AVX-512, 1 AVX2+FMA, 0 the compiler's baseline.")

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: object) -> object:
        return v.upper() if isinstance(v, str) else v

    @field_validator("redis_url")
    @classmethod
    def _check_url(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        from service.store import cluster_nodes, is_cluster, is_sentinel, sentinel_spec

        if is_cluster(v):
            cluster_nodes(v)  # a ValueError names what is wrong
        elif is_sentinel(v):
            sentinel_spec(v)
        elif not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss://, unix://, redis+cluster://, rediss+cluster://, "
                             "redis+sentinel:// or rediss+sentinel://")
        return v

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, v: str) -> str:
        for item in filter(None, (s.strip() for s in v.split(","))):
            key, _, scope = item.partition(":")
            if len(key) < 8:
                raise ValueError("each API key must be at least 8 characters")
            if scope not in ("", "read", "write"):
                raise ValueError(f"unknown key scope {scope!r} (use KEY or KEY:read)")
        return v

    @field_validator("allowed_origins")
    @classmethod
    def _check_origins(cls, v: str) -> str:
        for item in filter(None, (s.strip() for s in v.split(","))):
            if item != "*" and not re.fullmatch(r"https?://[^/\s]+/?", item):
                raise ValueError(f"{item!r} is not an origin: give scheme://host[:port], e.g. https://grafana.example.com, or *")
        return v

    @cached_property
    def keys(self) -> dict[str, str]:
        """API key -> scope ('write' includes read)."""
        out: dict[str, str] = {}
        for item in filter(None, (s.strip() for s in self.api_keys.split(","))):
            key, _, scope = item.partition(":")
            out[key] = scope or "write"
        return out

    def scope_of(self, presented: str | None) -> str | None:
        """The scope of a presented key, compared in constant time against every key; None if unknown."""
        if presented is None:
            return None
        found = None
        for key, scope in self.keys.items():
            if hmac.compare_digest(key.encode(), presented.encode()):
                found = scope
        return found


#: names Kubernetes gives a Service's address in every pod of its namespace (a Service named
#: "cusp-api": CUSP_API_SERVICE_HOST, CUSP_API_PORT_8000_TCP_ADDR, ...): not settings, not typos
_SERVICE_VARIABLE = re.compile(r"^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)?)$")


def unknown_variables(environ) -> list[str]:
    """The environment's CUSP_ variables that are no setting, each with the setting it is closest
    to where one is close ("CUSP_MAX_BODY_BYTE (CUSP_MAX_BODY_BYTES?)"): a typo left the default
    in force without a word (a new user's trial). Kubernetes' Service variables are left out."""
    import difflib

    known = {"CUSP_" + k.upper() for k in Settings.model_fields}
    out = []
    for name in sorted(environ):
        if not name.startswith("CUSP_") or name in known or _SERVICE_VARIABLE.match(name):
            continue
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        out.append(f"{name} ({near[0]}?)" if near else name)
    return out


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment (overrides win), raising SystemExit with a clear message if invalid."""
    from pydantic import ValidationError

    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            name = "CUSP_" + "_".join(str(p) for p in err["loc"]).upper()
            lines.append(f"  {name}: {err['msg']}")
        raise SystemExit("invalid cusp settings:\n" + "\n".join(lines)) from None
