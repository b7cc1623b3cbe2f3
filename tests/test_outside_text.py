"""A trainer's output is text wherever it is shown: a log line holding the chat catalogue's person markers, Slack's
mention syntax and terminal escapes mentions nobody and moves no cursor, in Slack and in DingTalk.

The trainer is a real subprocess of the real runner on the local cloud; it prints the hostile line and fails, and
the runner's ``failed`` report (its failure and its log tail) reaches the real bot, which tells the job's thread.
What the fake Slack and the fake DingTalk received is what is asserted. The console's side (a real terminal)
is in tests/test_console.py; the cleaning itself is tested here on its own too.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.chat.catalog import PERSON_CLOSE, PERSON_OPEN, person, text
from bot.chat.console import terminal_text
from bot.chat.dingtalk.markdown import escape_markdown
from bot.chat.slack.blocks import mrkdwn
from fakes.bot_harness import quick_recipe, running_bot, running_dingtalk_bot, slack_settings, wait_job, write_config
from fakes.fake_dingtalk import FakeDingTalk
from fakes.fake_slack import FakeSlack
from handlers import commands
from handlers.errors import ReasonError
from handlers.failures import Failure
from handlers.jobs import JobState
from handlers.outside_text import clean_line, clean_text
from handlers.reports import Failed, parse_report
from tests.test_dingtalk_language import GROUP, OWNER, ask
from tests.test_slack_http import CHANNEL, command, started

# A person marked as the catalogue marks one (Slack makes it a mention), Slack's own mention syntax, a colour, a
# window title set by OSC, and DingTalk's @all.
HOSTILE = f"{PERSON_OPEN}slack:U0EVE{PERSON_CLOSE} <!here> <@U0EVE> \x1b[31mRED\x1b[0m \x1b]0;pwned\x07@all done"
SHOWN = "slack:U0EVE <!here> <@U0EVE> RED @all done"  # the same line, cleaned where the report entered
LOUD = quick_recipe("loud", f"import sys; print({HOSTILE!r}, flush=True); sys.exit(3)")
RAW = re.compile(f"[\x00-\x09\x0b-\x1f\x7f-\x9f{PERSON_OPEN}{PERSON_CLOSE}]")  # what no platform may receive


def strings(value: Any) -> Iterator[str]:
    """Every string in a message as the fake received it (its text, its blocks, nested)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


@pytest.fixture
async def dingtalk() -> AsyncIterator[FakeDingTalk]:
    async with FakeDingTalk() as fake:
        yield fake


async def test_a_trainers_log_line_with_mention_markers_and_escapes_is_text_in_slack(
    tmp_path: Path, slack: FakeSlack
) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[LOUD])
    async with running_bot(tmp_path / "state", config, **slack_settings(slack.api_url)) as (service, _console):
        job_id = started((await command(service, "start loud"))[1])
        await wait_job(service, job_id, lambda job: job.state is JobState.FAILED)
        said = await slack.wait_for(
            lambda: [m for m in slack.channel_messages(CHANNEL, top_level=False) if "RED" in m.text]
        )
        everything = [s for message in slack.channel_messages(CHANNEL, top_level=False) for s in strings(message.text)]
        everything += [s for message in slack.messages.values() for s in strings(message.blocks)]
        assert [s for s in everything if RAW.search(s.replace("\n", ""))] == []  # no escape, no marker, anywhere
        note = said[0].text
        # Shown as written: the person marker pair's name as text, Slack's syntax escaped, the colour gone.
        assert "slack:U0EVE &lt;!here&gt; &lt;@U0EVE&gt; RED @all done" in note, note
        assert all("<@U0EVE>" not in s and "<!here>" not in s for s in everything)  # nobody was mentioned


async def test_a_trainers_log_line_with_mention_markers_and_escapes_is_text_in_dingtalk(
    tmp_path: Path, dingtalk: FakeDingTalk
) -> None:
    config = write_config(
        tmp_path / "bot.yaml",
        policy={"allow": {"start": ["dingtalk:*"]}},
        recipes=[LOUD],
        dingtalk={"channels": {GROUP: {"language": "en"}}},
    )
    async with running_dingtalk_bot(tmp_path / "state", dingtalk, config) as (service, _console):
        job_id = started(await ask(dingtalk, "start loud", sender=OWNER))
        await wait_job(service, job_id, lambda job: job.state is JobState.FAILED)
        await dingtalk.wait_until(
            lambda: any("RED" in m["text"] for m in dingtalk.group_messages), what="the failure in the group"
        )
        received = [*dingtalk.group_messages, *dingtalk.robot_messages, *dingtalk.session_replies]
        everything = [s for message in received for s in strings(message)]
        assert [s for s in everything if RAW.search(s.replace("\n", ""))] == []
        note = next(m["text"] for m in dingtalk.group_messages if "RED" in m["text"])
        # DingTalk's markup characters in their full-width twins: shown, never markup; nobody is @-mentioned.
        assert "slack:U0EVE ＜!here＞ ＜@U0EVE＞ RED @all done" in note, note
        assert all(not (m.get("at") or {}).get("isAtAll") for m in dingtalk.robot_messages)


def test_outside_text_loses_markers_controls_and_escapes_once_where_it_enters() -> None:
    assert clean_line(HOSTILE) == SHOWN
    assert clean_text("one\r\ntwo\rthree\n\tfour\x00\x7f\x85") == "one\ntwo\nthree\n four"
    assert clean_line("one\r\ntwo") == "one two"
    assert clean_text("\x1b]8;;https://evil\x1b\\link\x1b]8;;\x1b\\ \x9b2J\u202eevil") == "link evil"
    assert clean_text("中文 and 😀 stay") == "中文 and 😀 stay"
    # The report parser cleans every string of a report read from the wire, and of one the runner builds.
    said = Failure.of("storage-unreachable", error="x")
    wire = Failed(job_id="ft-abcd", attempt=1, failure=said).model_dump(mode="json")
    wire.update(failure={"code": "storage-unreachable", "values": {"error": f"{HOSTILE}\nsecond line"}})
    wire.update(log_tail=[HOSTILE])
    failed = parse_report(wire)
    assert isinstance(failed, Failed)
    assert failed.log_tail == [SHOWN] and failed.failure.values["error"] == f"{SHOWN}\nsecond line"
    assert Failed(job_id="ft-abcd", attempt=1, failure=said, log_tail=[HOSTILE]).log_tail == [SHOWN]
    with pytest.raises(ValueError, match="URI"):
        parse_report({**wire, "type": "completed", "output_uri": "s3://bucket/out\x1b[2J"})
    # A person typed it: the command parser cleans it before echoing any of it back.
    with pytest.raises(ReasonError) as unknown:
        commands.parse(f"frobnicate{PERSON_OPEN}x\x1b[31m")
    assert PERSON_OPEN not in str(unknown.value.reason.values) and "\x1b" not in str(unknown.value.reason.values)


def test_each_platform_shows_outside_text_as_written_and_only_the_bots_own_persons_as_mentions() -> None:
    said = text("en", "card.acked", by=person("slack:U0ANA"), at="12:00")  # a person the bot itself names
    assert "<@U0ANA>" in mrkdwn(said)
    assert mrkdwn(SHOWN) == "slack:U0EVE &lt;!here&gt; &lt;@U0EVE&gt; RED @all done"
    assert escape_markdown(SHOWN) == "slack:U0EVE ＜!here＞ ＜@U0EVE＞ RED @all done"
    # The terminal gets no control character as itself, whatever slipped past: each is shown as its escape.
    assert terminal_text("a\x1b[31mb\x07\nc") == "a\\x1b[31mb\\x07\nc"
    assert terminal_text(said) == said.replace(PERSON_OPEN, "").replace(PERSON_CLOSE, "")
