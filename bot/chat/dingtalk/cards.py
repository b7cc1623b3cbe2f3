"""The job card as an interactive card: its id, the template's fields, and what its buttons run.

Card template contract (build it once in the DingTalk card platform, then set ``card_template_id``):
string variables ``title``, ``status``, ``content`` (markdown), ``state`` (the raw job state), the button
labels ``ack_label``, ``stop_label``, ``resume_label``, ``on_demand_label`` and their switches ``show_ack``,
``show_stop``, ``show_resume``, ``show_on_demand`` (``"true"``/``"false"``), and ``notice`` (per user: the bot's
answer to that user's click). Each button's event is a callback request with the parameter ``action``:
``ack``, ``stop``, ``resume`` or ``on-demand``.

A click runs the very command a user could type (``stop ft-7k2q`` …), so the same permission checks apply.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from bot.chat.catalog import Lang, text
from bot.chat.dingtalk.markdown import escape_markdown
from bot.chat.render import card, state_text
from handlers.jobs import Job
from handlers.outside_text import clean_line
from handlers.transitions import next_state

TRACK_PREFIX = "finetune"
_TRACK = re.compile(rf"^{TRACK_PREFIX}-(ft-[a-z0-9]+)-\d+$")
MAX_VALUE_BYTES = 1000  # DingTalk takes up to 1 KB per card value

# Button action -> the command it runs on the card's job.
BUTTONS = {
    "ack": "ack {job}",
    "stop": "stop {job}",
    "resume": "resume {job}",
    "on-demand": "resume {job} on-demand",
}


def out_track_id(job: Job) -> str:
    """The card's own id: the job id plus its creation time, so a reused short job id never hits an old card."""
    return f"{TRACK_PREFIX}-{job.id}-{int(job.created_at.timestamp())}"


def job_of(track: str) -> str | None:
    match = _TRACK.fullmatch(track)
    return match.group(1) if match else None


def card_params(job: Job, now: datetime, lang: Lang) -> dict[str, str]:
    shown = card(job, now, lang)
    content = "\n\n".join(f"**{label}**: {escape_markdown(value)}" for label, value in shown.fields[1:])
    page_open = job.page is not None and not job.page.acked_by
    switches = {
        "ack": page_open and next_state(job.state, "ack") is not None,
        "stop": next_state(job.state, "stop") is not None,
        "resume": next_state(job.state, "resume") is not None,
        "on_demand": next_state(job.state, "resume") is not None,
    }
    return {
        "title": shown.title,
        "status": state_text(job.state, lang),
        "state": job.state.value,
        "content": _clip(content),
        **{f"{name}_label": text(lang, f"button.{name.replace('_', '-')}") for name in switches},
        **{f"show_{name}": "true" if on else "false" for name, on in switches.items()},
    }


def clicked(content: dict[str, Any]) -> str | None:
    """The button's action from a callback's content: its ``action`` parameter, else the component's id (outside
    text, cleaned where it enters: it is echoed when it names no button)."""
    private = content.get("cardPrivateData") or {}
    params = private.get("params") or {}
    action = params.get("action")
    if isinstance(action, str):
        return clean_line(action)
    ids = private.get("actionIds") or []
    return clean_line(str(ids[0])) if ids else None


def _clip(value: str) -> str:
    data = value.encode()
    if len(data) <= MAX_VALUE_BYTES:
        return value
    return data[: MAX_VALUE_BYTES - 3].decode(errors="ignore") + "…"
