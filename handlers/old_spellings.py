"""Words older versions wrote, read as today's: every old spelling the project still accepts, in one place.

Each edge that reads something an older version may have written (a control object, a spec, a runner's report,
the config file, a Slack button on a message already in a channel) maps it here, once, before validation, and
logs one deprecation line per process per spelling; past the edge only today's words exist. Nothing here is
ever written: an old spelling is read, never produced. The one table not here is the Slack button ids'
(``OLD_ACTION_IDS`` in bot/chat/slack/actions.py, next to the ids they map to); it logs through :func:`deprecated`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

# The control object (handlers/spec.py): ``action`` was its discriminator, and an interrupt test was a "drill".
CONTROL_FIELDS = {"action": "type"}
CONTROL_TYPES = {"drill": "interrupt-test"}
# A spec's ``release`` (handlers/spec.py): ``kind`` was its discriminator.
RELEASE_FIELDS = {"kind": "type"}
# A bus message (handlers/messages.py) from before ``type`` was its discriminator: an interrupt test was "drill".
MESSAGE_TYPES = {"drill": "interrupt-test"}
# A runner's notice (handlers/reports.py): the Alibaba runner said "termination" for a spot interruption.
NOTICE_KINDS = {"termination": "spot-interruption"}
# A runner's notice source for an interrupt test carried out through the control object.
NOTICE_SOURCES = {"drill": "interrupt-test"}
# The config file's cloud sections (bot/settings.py), per section.
CONFIG_FIELDS: Mapping[str, Mapping[str, str]] = {
    "aws": {"drill_notice": "interrupt_test_notice"},
    "aliyun": {"drill_grace_seconds": "interrupt_test_grace_seconds"},
}

_told: set[tuple[str, str]] = set()


def deprecated(where: str, old: str, new: str) -> None:
    """Log that ``where`` was read in an old spelling (once per process per spelling): whoever wrote it should
    move to the new one, as nothing reads the old one forever."""
    if (where, old) in _told:
        return
    _told.add((where, old))
    log.warning("deprecated: %s says %r, read as %r; write %r instead", where, old, new, new)


def renamed_fields(raw: Any, where: str, renames: Mapping[str, str]) -> Any:
    """``raw`` with each old field name in ``renames`` moved to its new name (a dict; anything else as it is).
    Where both are present the new one wins and the old one is left for validation to refuse."""
    if not isinstance(raw, dict) or not any(old in raw for old in renames):
        return raw
    upgraded = dict(raw)
    for old, new in renames.items():
        if old in upgraded and new not in upgraded:
            upgraded[new] = upgraded.pop(old)
            deprecated(where, old, new)
    return upgraded


def renamed_value(raw: Any, where: str, field: str, renames: Mapping[str, str]) -> Any:
    """``raw`` with the value of ``field`` renamed when it is an old one in ``renames``."""
    if not isinstance(raw, dict):
        return raw
    value = raw.get(field)
    if not isinstance(value, str) or value not in renames:
        return raw
    deprecated(f"{where}.{field}", value, renames[value])
    return {**raw, field: renames[value]}


def forget() -> None:
    """Tell every spelling again, as a fresh process would (for tests that read the deprecation line)."""
    _told.clear()
