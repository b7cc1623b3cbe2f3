"""A report speaks of its own job's storage only: every URI it carries lies under the job's prefix.

The bot records a report's checkpoint URI as the job's checkpoint and posts a completion's ``output_uri`` in the
channel as a link; a runner writes under its job's own prefix (``<checkpoint prefix><job id>/``, the spec's
``checkpoint_uri``) and nowhere else, so a URI outside it (another job's output, another bucket, a web page) can
only come from a key used for something its attempt never did. Such a report is refused at the gate and changes
nothing. Under means: the prefix (which ends with ``/``) and then a relative key of plain segments: no ``.`` or
``..`` (also percent-encoded), no query, fragment, backslash, whitespace or control character, so the rest cannot
climb out of the prefix wherever the URI is resolved.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from handlers.reports import CheckpointSaved, Completed, Interrupted, RunnerReport

_UNSAFE = re.compile(r"[?#\\\s\x00-\x1f\x7f]")


def uris_of(report: RunnerReport) -> list[str]:
    """The URIs of the job's storage a report asks the bot to record or show: a completion's output, a committed
    checkpoint (also the one an interruption names)."""
    if isinstance(report, Completed):
        return [report.output_uri]
    if isinstance(report, CheckpointSaved):
        return [report.uri]
    if isinstance(report, Interrupted) and report.uri is not None:
        return [report.uri]
    return []


def under(uri: str, prefix: str) -> bool:
    """Whether ``uri`` names something under ``prefix`` (a job's prefix, ending with ``/``)."""
    if not prefix.endswith("/") or not uri.startswith(prefix):
        return False
    rest = uri[len(prefix) :]
    if _UNSAFE.search(rest) or _UNSAFE.search(unquote(rest)):
        return False
    return all(segment not in (".", "..") for segment in unquote(rest).split("/"))


def outside_prefix(report: RunnerReport, prefix: str) -> str | None:
    """None when every URI the report carries lies under ``prefix``; else which one does not (for the log)."""
    for uri in uris_of(report):
        if not under(uri, prefix):
            return f"{report.type} names {uri[:200]!r}, outside the job's prefix {prefix}"
    return None
