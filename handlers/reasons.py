"""What the handlers tell a person (why a command was refused, what was wrong with it), as data, not prose.

The handlers decide; they do not know which language the channel reads. So a sentence meant for a person is a
:class:`Reason`: a catalogue key and the values to put in it. The bot renders it in the channel's language
(``bot.chat.catalog``); ``str()`` gives the English wording, for logs, job history and the console. Each
handler module keeps its English sentences next to the code that says them (a :class:`Wording`), and the
English catalogue is made of those very tables, so there is one English text, not two that can drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Reason:
    """A sentence for a person: ``key`` in the catalogue, ``values`` to fill in, and its English ``template``.

    A value may itself be a Reason (a usage line inside a usage error); it is rendered in the same language.
    """

    key: str
    template: str
    values: Mapping[str, Any] = field(default_factory=dict)

    @property
    def english(self) -> str:
        return self.template.format(**self.values)

    def __str__(self) -> str:
        return self.english


class Wording:
    """One module's English sentences by key; calling it makes a Reason (an unknown key fails at once)."""

    def __init__(self, sentences: Mapping[str, str]) -> None:
        self.sentences = dict(sentences)

    def __call__(self, key: str, /, **values: Any) -> Reason:
        return Reason(key, self.sentences[key], values)
