"""Commands packed for the wire by hiredis (C), not by redis-py's asyncio client (Python, one join per argument).

redis-py's synchronous client packs with hiredis when it is installed; its asyncio client never does, and packing
was the bot's largest single cost per event (a job write is one EVALSHA of some twenty arguments). The same
connection classes, with :func:`hiredis.pack_command` doing the packing; the protocol on the wire is identical.
"""

from __future__ import annotations

from typing import Any, cast

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError


def pack(args: tuple[Any, ...]) -> list[bytes]:
    """One command in RESP, as redis-py's ``pack_command`` returns it (a command name with a space is split; a
    bool, None or any other type it refuses is a DataError, as there)."""
    head = args[0]
    if (isinstance(head, str) and " " in head) or (isinstance(head, bytes) and b" " in head):
        args = (*head.split(), *args[1:])
    try:
        return [hiredis.pack_command(cast(Any, args))]  # its stub reads as a 1-tuple; any length is packed
    except TypeError:
        plain = tuple(bytes(arg) if isinstance(arg, bytearray) else arg for arg in args)
        try:
            return [hiredis.pack_command(cast(Any, plain))]
        except TypeError as exc:
            raise DataError(f"Invalid input in {args[0]!r}: {exc}") from exc


class _Packed(Connection):
    def pack_command(self, *args: Any) -> list[bytes]:
        return pack(args)


class _PackedSSL(SSLConnection):
    def pack_command(self, *args: Any) -> list[bytes]:
        return pack(args)


class _PackedUnix(UnixDomainSocketConnection):
    def pack_command(self, *args: Any) -> list[bytes]:
        return pack(args)


_PACKED: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: _Packed,
    SSLConnection: _PackedSSL,
    UnixDomainSocketConnection: _PackedUnix,
}


def packed_by_hiredis(client: aioredis.Redis) -> aioredis.Redis:
    """``client``, its pool making connections that pack with hiredis (before it made any)."""
    pool = client.connection_pool
    pool.connection_class = _PACKED.get(pool.connection_class, pool.connection_class)
    return client
