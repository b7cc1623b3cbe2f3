"""The key this runner signs its reports with: its attempt's own, never the bot's master (which it never holds)."""

from __future__ import annotations

import os

KEY_VARIABLE = "FINETUNE_REPORT_SECRET"


def report_key(fetched: str | None = None) -> str:
    """The attempt's key: the one fetched from its key object (AWS, runner/reports/key_object.py), else
    ``FINETUNE_REPORT_SECRET`` (the local cloud's environment, Alibaba's boot script); empty when neither has one."""
    return fetched or os.environ.get(KEY_VARIABLE, "")
