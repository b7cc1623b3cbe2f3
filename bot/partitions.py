"""The store's key layout as recorded in Redis: how many partitions it has (see :mod:`bot.keys`).

The count is chosen once, when the first bot meets an empty store (one on a single server, ``CLUSTER_PARTITIONS``
on a cluster), and read back by every later bot and replica: a job's partition follows from its id and the count,
so the count never changes under a live store (growing it is a migration, see docs/production.md, Redis).
"""

from __future__ import annotations

import redis.asyncio as aioredis

from bot.errors import ConfigError
from bot.keys import CLUSTER_PARTITIONS, DEFAULT_PREFIX, Keys

PARTITIONS_FIELD = "partitions"


def default_partitions(cluster: bool) -> int:
    """What a new store gets: one partition on a single server (nothing to spread), sixteen on a cluster."""
    return CLUSTER_PARTITIONS if cluster else 1


async def open_keys(redis: aioredis.Redis, prefix: str = DEFAULT_PREFIX, partitions: int | None = None) -> Keys:
    """The keys of the store under ``prefix``: its recorded partition count, or ``partitions`` (else the default
    for this kind of server) recorded now when the store has none yet (HSETNX: the first bot to start decides)."""
    layout = Keys(prefix).layout
    cluster = is_cluster_client(redis)
    recorded = await redis.hget(layout, PARTITIONS_FIELD)
    if recorded is None:
        if partitions is None:
            partitions = default_partitions(cluster)
        await redis.hsetnx(layout, PARTITIONS_FIELD, str(partitions))
        recorded = await redis.hget(layout, PARTITIONS_FIELD)
    keys = Keys(prefix, int(recorded or 1))
    if cluster and keys.partitions == 1:
        raise ConfigError(
            f"the store under {prefix!r} at this Redis cluster has one partition (written by a bot on a single "
            "server): its scripts cannot run on a cluster; copy it into a partitioned store (docs/production.md: Redis)"
        )
    return keys


def is_cluster_client(redis: object) -> bool:
    """Is ``redis`` redis-py's cluster client (made by :func:`bot.redis_server.connect` for a cluster)?"""
    from redis.asyncio.cluster import RedisCluster

    return isinstance(redis, RedisCluster)
