"""JSON from a stranger, read with a size and a depth limit.

``json.loads`` of ``[`` repeated 200,000 times raises ``RecursionError`` (not a ``ValueError``), which a handler
that catches ``ValueError`` lets through as a 500 with a traceback; a document nested a few thousand deep is legal
JSON that nothing here needs. A string escape of half a surrogate pair (``"\\udcff"``) is legal JSON too, but
the ``str`` it makes cannot be encoded (``UnicodeEncodeError`` wherever it is signed, hashed or sent on). :func:`loads`
turns all three, and a body larger than the caller allows, into one :class:`~handlers.errors.UnrecognisedMessage`
(a ``ValueError``, so ``except ValueError`` keeps working). Every document the bot receives (runner reports, SNS
envelopes and their messages, EventBridge and CloudMonitor events, Slack interactions) is a few levels deep.
"""

from __future__ import annotations

import json
import re
from typing import Any

from handlers.errors import UnrecognisedMessage

MAX_DEPTH = 32
MAX_BYTES = 1024 * 1024
_SURROGATE = re.compile("[\ud800-\udfff]")  # once decoded, a pair is one character: any surrogate left is lone


def loads(data: str | bytes, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` within ``max_bytes`` (of the encoded text) and ``max_depth`` levels of arrays and objects."""
    size = len(data) if isinstance(data, bytes) else len(data.encode(errors="surrogatepass"))
    if size > max_bytes:
        raise UnrecognisedMessage(f"a JSON document of {size} bytes (at most {max_bytes})")
    try:
        document = json.loads(data)
    except RecursionError:
        raise UnrecognisedMessage(f"a JSON document nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise UnrecognisedMessage(f"not JSON: {str(exc)[:120]}") from None
    problem = _problem(document, max_depth)
    if problem:
        raise UnrecognisedMessage(problem)
    return document


def _problem(document: Any, limit: int) -> str | None:
    """Why ``document`` is refused (arrays and objects more than ``limit`` deep, a string holding a lone surrogate),
    or None; walked without recursion."""
    pending: list[tuple[Any, int]] = [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return "a JSON string holding half a surrogate pair"
            continue
        if isinstance(value, dict):
            children: Any = [*value.keys(), *value.values()]
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return f"a JSON document nested deeper than {limit} levels"
        pending.extend((child, depth + 1) for child in children)
    return None
