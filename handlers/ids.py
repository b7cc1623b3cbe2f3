"""Job and event identifiers: short and typeable for people, unique enough for machines."""

from __future__ import annotations

import os
import secrets

JOB_ID_PATTERN = r"^ft-[a-z0-9]{3,16}$"
_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no l/1/o/0: people type these ids from chat


def new_job_id(length: int = 4) -> str:
    """A job id like ``ft-7k2q``; the store retries on the rare collision."""
    return "ft-" + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def new_event_id() -> str:
    """A globally unique event id (128 random bits in hex, as long as a uuid4's); the bot deduplicates
    redeliveries on it. Every note a decision makes takes one: ``os.urandom`` costs a tenth of ``uuid4``."""
    return os.urandom(16).hex()
