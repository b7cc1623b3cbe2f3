""""Did you mean …?" for a key the configuration file does not have: the closest key the settings model has at that
place (``policy.admin`` → ``admins``), found by walking the model along the error's location."""

from __future__ import annotations

import difflib
import types
from collections.abc import Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel


def closest_key(model: type[BaseModel], loc: Sequence[str | int]) -> str | None:
    """The key of ``model``'s tree nearest to the unknown key at ``loc`` (its last part), among the keys allowed
    beside it; None when none is close."""
    if not loc:
        return None
    close = difflib.get_close_matches(str(loc[-1]), keys_at(model, loc[:-1]), n=1)
    return close[0] if close else None


def keys_at(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The keys a mapping at ``loc`` in ``model``'s tree may have (none where the walk cannot tell)."""
    kinds: list[Any] = [model]
    for part in loc:
        kinds = [inner for kind in kinds for inner in _step(kind, part)]
    return sorted({key for kind in kinds for key in _keys(kind)})


def _step(kind: Any, part: str | int) -> list[Any]:
    """What sits at ``part`` inside a value of type ``kind``."""
    found: list[Any] = []
    for one in alternatives(kind):
        origin = get_origin(one)
        if isinstance(one, type) and issubclass(one, BaseModel):
            for name, field in one.model_fields.items():
                if part in (name, field.alias):
                    found.append(field.annotation)
        elif origin in (list, tuple, set, frozenset) and isinstance(part, int):
            found.extend(get_args(one)[:1])
        elif origin is dict:
            found.extend(get_args(one)[1:2])
    return found


def _keys(kind: Any) -> list[str]:
    return [
        field.alias or name
        for one in alternatives(kind)
        if isinstance(one, type) and issubclass(one, BaseModel)
        for name, field in one.model_fields.items()
    ]


def alternatives(kind: Any) -> list[Any]:
    """``kind`` without unions and ``Annotated``: the types a value of it may have (``None``'s among them where it
    is optional). The configuration reference reads the settings models' types through it too."""
    origin = get_origin(kind)
    if origin is Annotated:
        return alternatives(get_args(kind)[0])
    if origin in (Union, types.UnionType):
        return [inner for arg in get_args(kind) for inner in alternatives(arg)]
    return [kind]
