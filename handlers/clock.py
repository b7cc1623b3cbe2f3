"""The clock: the one "now" of the bot, the runner and the core, an aware UTC time.

Code that must be tested against time takes a ``clock`` argument defaulting to :func:`utcnow`, so a test injects
its own instead of racing the wall clock.
"""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)
