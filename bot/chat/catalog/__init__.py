"""Every label and sentence people read, per language, in one place: ``text(lang, key, **values)``.

The renderer and the chat adapters look words up here instead of writing them inline, so a language is one
module (``en.py``, ``zh_cn.py``) with the same keys and the same ``{placeholders}``. Which language a channel
gets is the adapter's configuration (DingTalk: zh-CN by default; Slack and the console: English). What the
handlers say to a person comes as a :class:`~handlers.reasons.Reason` and is put in words by :func:`say`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from bot.chat.catalog import en, zh_cn
from handlers.jobs import JobState
from handlers.reasons import Reason

Lang = Literal["en", "zh-CN"]
LANGUAGES: tuple[Lang, ...] = get_args(Lang)

_MESSAGES: dict[Lang, Mapping[str, str]] = {"en": en.MESSAGES, "zh-CN": zh_cn.MESSAGES}


# A person the bot names in a sentence (who stopped a job, who acknowledged a page) is put between these two
# private-use characters by :func:`person`; each platform turns the pair into its own mention (Slack) or the plain
# name (:func:`plain`). Every other value filled into a sentence loses them, so nothing that came from elsewhere
# (a log line, a failure message, a user's own words) can ever become a mention: mentions are only of the people
# the bot itself chose to name.
PERSON_OPEN, PERSON_CLOSE = "\ue000", "\ue001"


class Sentence(str):
    """A sentence of this catalogue, or a person it names: the markers in it are the bot's own."""

    __slots__ = ()


def person(name: str) -> Sentence:
    """``name`` (``slack:U…``, ``dingtalk:…``) marked as a person the sentence names."""
    return Sentence(PERSON_OPEN + _inert(name) + PERSON_CLOSE)


def plain(sentence: str) -> str:
    """The sentence for a platform without mentions (the console, a log): the persons as their names."""
    return str.replace(str.replace(sentence, PERSON_OPEN, ""), PERSON_CLOSE, "")


def text(lang: Lang, key: str, /, **values: Any) -> Sentence:
    """The sentence ``key`` in ``lang`` with ``values`` filled in (``str.format`` rules).

    A value that is not itself a :class:`Sentence` loses any person marker it carries."""
    safe = {name: value if isinstance(value, Sentence) else _inert(value) for name, value in values.items()}
    return Sentence(_MESSAGES[lang][key].format(**safe))


def _inert(value: Any) -> Any:
    if isinstance(value, str) and (PERSON_OPEN in value or PERSON_CLOSE in value):
        return str.replace(str.replace(value, PERSON_OPEN, ""), PERSON_CLOSE, "")
    return value


def say(lang: Lang, reason: Reason) -> Sentence:
    """A handler's Reason in ``lang``: a Reason inside it in the same language, a job state by its name there."""
    return text(lang, reason.key, **{name: _value(lang, value) for name, value in reason.values.items()})


def _value(lang: Lang, value: Any) -> Any:
    if isinstance(value, Reason):
        return say(lang, value)
    if isinstance(value, JobState):
        return text(lang, f"state.{value.value}")
    return value


def word(lang: Lang, key: str, fallback: str) -> str:
    """A word that may have no entry (a runner's phase name, an action): the entry, else ``fallback``."""
    return _MESSAGES[lang].get(key, fallback)


def messages(lang: Lang) -> Mapping[str, str]:
    """The whole catalogue of one language (for tests that hold the languages in step)."""
    return _MESSAGES[lang]
