"""Text from outside the bot, cleaned once where it enters: what a runner reports (a trainer's log lines, a failure's
detail, any free text), what a person types in a chat, who a paging tool says acknowledged.

Cleaning takes out what no platform may receive as it came:

- terminal escape sequences whole (``ESC [ … m`` colours, ``ESC ] … BEL`` titles and links, their 8-bit C1 forms),
  so the console never prints a raw escape and no chat shows the leftover ``[31m``;
- every other control character (C0, DEL, C1); a multi-line field keeps its line breaks (``\\r\\n`` and a lone
  ``\\r`` become ``\\n``), a one-line field gets a space for each, and a tab is a space;
- the Unicode private-use area, which holds the chat catalogue's person markers (``bot.chat.catalog.PERSON_OPEN``
  and ``PERSON_CLOSE``, U+E000 and U+E001): a sentence turns a marked pair into a real mention, so text from
  outside must never carry one; and the bidirectional overrides, which make text read other than it is.

What remains is shown as text: each platform escapes it for its markup when it renders (Slack's ``& < >``,
DingTalk's ``[ ] < > #``), so ``<!here>`` in a log line reads as ``<!here>`` and mentions nobody.
"""

from __future__ import annotations

import re

# ESC followed by a CSI (ESC [ … final byte), an OSC / DCS / SOS / PM / APC string (ended by BEL or ESC \), or any
# other single character; the 8-bit CSI (U+009B) and string introducers likewise. An unterminated string runs to
# the end of the text: nothing after an unterminated title is meant to be read.
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[\x20-\x7e]?"
)
_NEWLINES = re.compile(r"\r\n?")
_SPACE = re.compile(r"[\t\n]")
# C0 but tab and newline (those are handled above), DEL, C1, bidi embeddings / overrides / isolates, private use.
_DROPPED = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ue000-\uf8ff]")


def clean_text(value: str) -> str:
    """``value`` for a multi-line field: escape sequences and control characters out, line breaks kept as ``\\n``."""
    value = _NEWLINES.sub("\n", _ESCAPE_SEQUENCE.sub("", value))
    return _DROPPED.sub("", value.replace("\t", " "))


def clean_line(value: str) -> str:
    """``value`` for a one-line field (a log line, a name): as :func:`clean_text`, with each line break a space."""
    return _SPACE.sub(" ", clean_text(value))
