"""Job and event identifiers: short and typeable for people, unique enough for machines."""

from __future__ import annotations

import os
import secrets

JOB_ID_PATTERN = r"^ft-[a-z0-9]{3,16}$"
_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no l/1/o/0: people type these ids from chat
# Twelve characters of 32 (5 bits each): 60 bits, ``ft-`` + 12 = 15 characters, still read off a card and typed.
# A job's id names its storage prefix and its history for as long as anything of it is kept (checkpoints outlive
# the bot's retention), so no two jobs of a deployment may ever share one, not only the live ones (the store's
# create retries those). The birthday bound over every job a deployment ever starts, n of them among N = 2**60:
# P(any two alike) <= n**2 / (2 N). A busy team, 1,000 jobs a day for ten years, starts n = 3.65e6:
# 1.3e13 / 2.3e18 = 6e-6. Even 10,000 a day for ten years stays under 6e-4. (Four characters, 2**20, had even odds
# of a repeat by the 1,200th job.)
JOB_ID_CHARS = 12


def new_job_id(length: int = JOB_ID_CHARS) -> str:
    """A job id like ``ft-7k2qm9xa4bcd``; the store still retries on a collision with a job it holds."""
    return "ft-" + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def new_event_id() -> str:
    """A globally unique event id (128 random bits in hex, as long as a uuid4's); the bot deduplicates
    redeliveries on it. Every note a decision makes takes one: ``os.urandom`` costs a tenth of ``uuid4``."""
    return os.urandom(16).hex()


def new_key_salt() -> str:
    """An attempt's report-key salt (:mod:`handlers.report_keys`): 128 random bits in hex, drawn when the attempt
    is planned and stored with it, so no attempt's key follows from its job id and number alone."""
    return os.urandom(16).hex()
