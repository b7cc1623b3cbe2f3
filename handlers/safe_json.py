"""JSON from a stranger, read with a size and a depth limit.

``json.loads`` of ``[`` repeated 200,000 times raises ``RecursionError`` (not a ``ValueError``), which a handler
that catches ``ValueError`` lets through as a 500 with a traceback; a document nested a few thousand deep is legal
JSON that nothing here needs. :func:`loads` turns both, and a body larger than the caller allows, into one
:class:`UnsafeJson` (a ``ValueError``, so ``except ValueError`` keeps working). Every document the bot receives
(runner reports, SNS envelopes and their messages, EventBridge and CloudMonitor events, Slack interactions) is a
few levels deep.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 32
MAX_BYTES = 1024 * 1024


class UnsafeJson(ValueError):
    """Not JSON the bot reads: too large, nested too deep, or not JSON at all."""


def loads(data: str | bytes, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` within ``max_bytes`` (of the encoded text) and ``max_depth`` levels of arrays and objects."""
    size = len(data) if isinstance(data, bytes) else len(data.encode(errors="surrogatepass"))
    if size > max_bytes:
        raise UnsafeJson(f"a JSON document of {size} bytes (at most {max_bytes})")
    try:
        document = json.loads(data)
    except RecursionError:
        raise UnsafeJson(f"a JSON document nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise UnsafeJson(f"not JSON: {str(exc)[:120]}") from None
    if _depth_over(document, max_depth):
        raise UnsafeJson(f"a JSON document nested deeper than {max_depth} levels")
    return document


def _depth_over(document: Any, limit: int) -> bool:
    """Whether ``document`` nests arrays and objects more than ``limit`` deep (walked without recursion)."""
    pending: list[tuple[Any, int]] = [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False
