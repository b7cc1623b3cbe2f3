"""Pages in the tools on-call lives in: PagerDuty and Opsgenie, named on the escalation ladder like a person.

A page is opened in a tool when the first ladder step that names the tool is sent, and only then; the job's page
remembers the tools it was opened in (:attr:`handlers.jobs.Page.tools`), so a later step naming the tool again,
a redelivered step or a second replica opens nothing more. An acknowledgement (in chat, or in one of the tools)
acknowledges it in every other tool it was opened in; a resume or a stop resolves it in all of them.

Each call is a ``pager`` note in the job change that causes it (:class:`~handlers.notes.PagerCall`), delivered by
the chat outbox's pager (:mod:`bot.pagers`) at least once and recorded once sent; the page's key (PagerDuty's
``dedup_key``, Opsgenie's ``alias``) makes a repeat harmless at the tool as well.
"""

from __future__ import annotations

import re
from typing import Literal, get_args

from handlers.ids import JOB_ID_PATTERN
from handlers.jobs import Job, Page
from handlers.messages import Notify
from handlers.notes import PagerCall

Tool = Literal["pagerduty", "opsgenie"]
TOOLS: tuple[Tool, ...] = get_args(Tool)
TOOL_NAMES: dict[str, str] = {"pagerduty": "PagerDuty", "opsgenie": "Opsgenie"}
KEY_PREFIX = "finetune-"
_KEY = re.compile(rf"{KEY_PREFIX}(?P<job>{JOB_ID_PATTERN.strip('^$')})-(?P<attempt>[0-9]{{1,6}})")


def page_key(job_id: str, attempt: int) -> str:
    """The page's key in every tool: one per page (a job's failed resume of ``attempt``), safe in a URL path."""
    return f"{KEY_PREFIX}{job_id}-{attempt}"


def parse_page_key(key: str) -> tuple[str, int] | None:
    """The job and attempt a tool's key names, or None for a key that is not one of ours."""
    found = _KEY.fullmatch(key)
    return (found["job"], int(found["attempt"])) if found else None


Action = Literal["trigger", "acknowledge", "resolve"]


def _call(job: Job, page: Page, tool: str, action: Action, by: str | None = None) -> Notify:
    reason = page.reason if action == "trigger" else None  # the tool's summary, said once
    note = PagerCall.model_validate(
        {"tool": tool, "action": action, "key": page_key(job.id, page.attempt), "reason": reason, "by": by}
    )
    return Notify(job_id=job.id, channel="pager", note=note)


def triggers(job: Job, page: Page, named: list[str]) -> tuple[Page, list[Notify]]:
    """Open the page in each tool of ``named`` it is not open in yet: the page that remembers them, and the calls."""
    new = [tool for tool in dict.fromkeys(named) if tool in TOOLS and tool not in page.tools]
    calls = [_call(job, page, tool, "trigger") for tool in new]
    return page.model_copy(update={"tools": [*page.tools, *new]}), calls


def acknowledgements(job: Job, page: Page, by: str, via: str | None) -> list[Notify]:
    """Acknowledge the page in every tool it is open in but ``via`` (where it was acknowledged already)."""
    return [_call(job, page, tool, "acknowledge", by=by) for tool in page.tools if tool != via]


def resolutions(job: Job, page: Page | None) -> list[Notify]:
    """Resolve the page in every tool it is open in (the job resumed or stopped: nobody needs waking)."""
    return [] if page is None else [_call(job, page, tool, "resolve") for tool in page.tools]
