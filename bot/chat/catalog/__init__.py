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


def text(lang: Lang, key: str, /, **values: Any) -> str:
    """The sentence ``key`` in ``lang`` with ``values`` filled in (``str.format`` rules)."""
    return _MESSAGES[lang][key].format(**values)


def say(lang: Lang, reason: Reason) -> str:
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
