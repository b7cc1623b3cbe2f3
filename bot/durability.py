"""How durable a state change must be before the bot acts on it: the ``redis.durability`` setting.

Replication to a Redis replica is asynchronous, so a primary that dies right after a write can take it with it:
its replica, promoted, never saw the change (or the effect, timer or note written with it). With ``replica`` the
store follows every state-changing script with ``WAIT 1 <timeout>`` on the same connection (Redis's own way to
say "one replica has everything this connection wrote"); with ``aof``, ``WAITAOF 1 0 <timeout>`` (the primary's
append-only file holds it, fsynced: a lone server's crash and restart lose nothing). The write is acknowledged
only then; when the wait runs out first the caller gets :class:`~bot.errors.StoreUnavailable` ("the write reached the
primary but not …": an outage to the bus, which keeps the event and runs it again once Redis answers; the store's
dedup keys make the rerun a no-op or the write itself, whichever survived). ``none`` (the default) waits for
nothing, as before.

MemoryDB needs none of this: its multi-AZ transaction log acknowledges a write only once it is durable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bot.errors import StoreUnavailable

Durability = Literal["none", "replica", "aof"]


class RedisOptions(BaseModel):
    """The config file's ``redis:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    durability: Durability = "none"
    # How long a state change may wait for its replica (or fsync) before it fails as StoreUnavailable.
    durability_timeout_ms: int = Field(default=2000, ge=10, le=60_000)


@dataclass(frozen=True, slots=True)
class DurableWrites:
    """The wait that follows a state-changing script (none for ``none``), and the check of its reply."""

    mode: Durability = "none"
    timeout_ms: int = 2000

    @classmethod
    def of(cls, options: RedisOptions) -> DurableWrites:
        return cls(options.durability, options.durability_timeout_ms)

    @property
    def wait(self) -> tuple[Any, ...] | None:
        """The command to send after the writes, on their connection; None when nothing is waited for."""
        if self.mode == "replica":
            return ("WAIT", 1, self.timeout_ms)
        if self.mode == "aof":
            return ("WAITAOF", 1, 0, self.timeout_ms)
        return None

    def check(self, reply: Any) -> None:
        """StoreUnavailable (a write that reached the primary but not, within the bounded wait, a replica or the AOF)
        unless ``reply`` (WAIT's count, WAITAOF's pair, or an error) says it is durable."""
        if isinstance(reply, Exception):
            raise StoreUnavailable(f"could not confirm the write ({self.mode}): {reply}") from reply
        done = int(reply[0]) if self.mode == "aof" else int(reply)
        if done < 1:
            what = "the primary's append-only file" if self.mode == "aof" else "any replica"
            raise StoreUnavailable(f"the write reached the primary but not {what} within {self.timeout_ms} ms")
