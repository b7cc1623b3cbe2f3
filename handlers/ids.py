"""Job and event identifiers: short and typeable for people, unique enough for machines."""

from __future__ import annotations

import secrets
import uuid

JOB_ID_PATTERN = r"^ft-[a-z0-9]{3,16}$"
_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no l/1/o/0: people type these ids from chat


def new_job_id(length: int = 4) -> str:
    """A job id like ``ft-7k2q``; the store retries on the rare collision."""
    return "ft-" + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def new_event_id() -> str:
    """A globally unique event id; the bot deduplicates redeliveries on it."""
    return uuid.uuid4().hex
