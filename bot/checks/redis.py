"""Does Redis answer, and what is it? ``REDIS_URL``'s server, or the embedded Valkey ``serve`` and ``demo`` would
start under ``FINETUNE_STATE_DIR`` (started and stopped here, as they would; left alone while a bot runs there)."""

from __future__ import annotations

from typing import Any

from bot.checks.result import Check, failed, passed
from bot.errors import StoreUnavailable
from bot.owner_lock import AlreadyOwned, OwnerLock
from bot.redis_server import open_redis, redacted
from bot.settings import Settings

NAME = "Redis"


async def check_redis(settings: Settings) -> Check:
    if settings.redis_url:
        fix = "start that server, or fix REDIS_URL (unset: an embedded Valkey under FINETUNE_STATE_DIR)"
        return await _probe(settings, f"at {redacted(settings.redis_url)}", fix)
    state_dir = settings.finetune_state_dir
    owner = OwnerLock(state_dir / "bot.lock")  # as a bot takes it: none starts on this state dir meanwhile
    try:
        owner.acquire()
    except AlreadyOwned as exc:
        return passed(NAME, f"the embedded Valkey of the bot running on {state_dir} (pid {exc.pid or '?'}), in use")
    except OSError as exc:
        return failed(NAME, f"FINETUNE_STATE_DIR={state_dir} cannot be used: {exc.strerror}", "make it writable")
    try:
        fix = "make FINETUNE_STATE_DIR writable, or set REDIS_URL to a server"
        return await _probe(settings, f"embedded, data in {state_dir / 'redis'}", fix)
    finally:
        owner.release()


async def _probe(settings: Settings, where: str, fix: str) -> Check:
    try:
        handle = await open_redis(settings)
    except AlreadyOwned as exc:  # a Valkey started by hand on this state dir's data
        return failed(NAME, f"a Valkey (pid {exc.pid or '?'}) already serves {exc.path.parent}", "stop it")
    except StoreUnavailable as exc:
        return failed(NAME, str(exc), fix)
    try:
        info = await handle.client.info("server")
    except StoreUnavailable as exc:
        return failed(NAME, str(exc), fix)
    finally:
        await handle.close()
    kind = "cluster" if handle.cluster else "single node"
    return passed(NAME, f"{_version(info)}, {kind}, {where}")


def _version(info: dict[str, Any]) -> str:
    """``Valkey 8.1.1`` / ``Redis 7.2.4`` from INFO server (a cluster client's answer is one node's, or per node)."""
    if "redis_version" not in info and info and all(isinstance(value, dict) for value in info.values()):
        info = next(iter(info.values()))
    if info.get("valkey_version"):
        return f"Valkey {info['valkey_version']}"
    return f"{str(info.get('server_name') or 'Redis').capitalize()} {info.get('redis_version', '?')}"
