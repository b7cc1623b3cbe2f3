"""One check's outcome: what was looked at, whether it is fine, what was found, and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Check:
    """``blocks_start``: ``serve`` refuses to start while this fails (no credentials, no region, no event source);
    any other failure is said at start and the bot runs."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    blocks_start: bool = False


def passed(name: str, detail: str) -> Check:
    return Check(name, True, detail)


def failed(name: str, detail: str, fix: str, *, blocks_start: bool = False) -> Check:
    return Check(name, False, detail, fix, blocks_start)
