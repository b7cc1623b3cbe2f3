"""Block Kit layouts without I/O: what a card and a page look like, and that outside text cannot inject markup."""

from __future__ import annotations

from datetime import UTC, datetime

from bot.chat.catalog import PERSON_CLOSE, PERSON_OPEN
from bot.chat.slack.blocks import (
    acked_page_layout,
    card_layout,
    mentions,
    mrkdwn,
    note_text,
    page_layout,
    reply_text,
    user,
)
from bot.chat.slack.config import SlackConfig
from fakes.notes import notify
from handlers.failures import Failure
from handlers.jobs import Attempt, ChatRef, Job, JobState
from handlers.notes import ResumeFailedPage

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def job(state: JobState = JobState.RUNNING, **extra: object) -> Job:
    attempt = Attempt(number=1, instance_id="i-1", instance_type="g5.xlarge", zone="us-east-1a", price_per_hour=0.5)
    return Job(
        id="ft-abcd",
        recipe="tiny",
        requested_by="slack:U0ANA",
        chat=ChatRef(platform="slack", channel="C0JOBS"),
        state=state,
        attempts=[attempt],
        step=40,
        total_steps=100,
        created_at=NOW,
        updated_at=NOW,
        **extra,  # type: ignore[arg-type]
    )


def action_ids(blocks: list[dict[str, object]]) -> list[str]:
    return [e["action_id"] for b in blocks if b["type"] == "actions" for e in b["elements"]]  # type: ignore[attr-defined]


def test_the_card_lays_out_the_shared_fields_and_offers_what_applies_now() -> None:
    text, blocks = card_layout(job(), NOW)
    assert text == "ft-abcd · tiny: 🟢 RUNNING"
    assert blocks[0] == {"type": "header", "text": {"type": "plain_text", "text": "ft-abcd · tiny", "emoji": True}}
    fields = [f["text"] for f in blocks[1]["fields"]]
    assert fields[0] == "*State*\n🟢 RUNNING" and "*Step*\n▰▰▰▰▱▱▱▱▱▱ 40% · 40/100" in fields
    assert "Started by <@U0ANA> · updated 03:04:05 UTC" in str(blocks)
    assert action_ids(blocks) == ["finetune_stop", "finetune_interrupt_test"]
    assert action_ids(card_layout(job(JobState.RESUME_FAILED), NOW)[1]) == ["finetune_stop"]
    assert action_ids(card_layout(job(JobState.SUCCEEDED), NOW)[1]) == []
    assert action_ids(card_layout(job(JobState.STOPPING), NOW)[1]) == []


def test_text_from_outside_is_escaped_and_cannot_mention_anyone() -> None:
    failed = job(JobState.FAILED, failure=Failure.of("launch-failed", error="<!channel> & <@U0EVE> broke <https://evil|here>"))
    _text, blocks = card_layout(failed, NOW)
    problem = next(f["text"] for f in blocks[1]["fields"] if f["text"].startswith("*Problem*"))
    assert problem == "*Problem*\nlaunch failed: &lt;!channel&gt; &amp; &lt;@U0EVE&gt; broke &lt;https://evil|here&gt;"
    assert user("console:<!here>") == "console:&lt;!here&gt;" and user("slack:U0ANA") == "<@U0ANA>"
    assert user("slack:U0ANA\n") == "slack:U0ANA\n"  # a trailing newline is not an id ("$" would have let it)


def test_only_the_persons_the_bot_names_become_mentions() -> None:
    stopped = notify("ft-abcd", "thread", "stop-requested", by="slack:U0BOB")
    assert note_text(job(), stopped, NOW) == "⏹️ Stop requested by <@U0BOB>: checkpointing, then releasing the instance."
    # A user id inside text from elsewhere (a log line, a runner's failure message) stays words.
    failed = notify("ft-abcd", "alert", "failed", reason=Failure.of("launch-failed", error="said: slack:U0EVE"))
    assert "<@" not in note_text(job(), failed, NOW) and "slack:U0EVE" in note_text(job(), failed, NOW)
    assert mrkdwn("Stop requested by slack:U0BOB.") == "Stop requested by slack:U0BOB."
    # Nor can outside text forge the bot's own person markers: they are dropped from every value filled in.
    forged_failure = Failure.of("launch-failed", error=f"{PERSON_OPEN}slack:U0EVE{PERSON_CLOSE}")
    forged = notify("ft-abcd", "alert", "failed", reason=forged_failure)
    said = note_text(job(), forged, NOW)
    assert "<@U0EVE>" not in said and "slack:U0EVE" in said and PERSON_OPEN not in said
    # A person who is not on Slack is named as escaped text.
    console = notify("ft-abcd", "thread", "stop-requested", by="console:<b>")
    assert "console:&lt;b&gt;" in note_text(job(), console, NOW)


def test_a_reply_to_one_person_is_escaped_too() -> None:
    assert reply_text("unknown recipe '<!channel> <https://evil|x>'") == (
        "unknown recipe '&lt;!channel&gt; &lt;https://evil|x&gt;'"
    )


X = Failure.of("launch-failed", error="x")


def test_page_mentions_come_first_and_only_from_valid_ids() -> None:
    people = [
        {"name": "a", "slack": "U0ANA"},
        {"name": "team", "slack": "S0TEAM"},
        {"name": "again", "slack": "U0ANA"},
        {"name": "bad", "slack": "U0X> <!everyone"},
        {"name": "dingtalk only", "slack": None, "dingtalk": "x"},
    ]
    assert mentions(ResumeFailedPage(reason=X, mention=people, everyone="channel")) == (
        "<@U0ANA> <!subteam^S0TEAM> <!channel>"
    )
    assert mentions(ResumeFailedPage(reason=X)) == ""
    note = notify("ft-abcd", "page", "resume-failed", **{"reason": X, "mention": people})
    text, plain, blocks = page_layout(job(JobState.RESUME_FAILED), note, NOW)
    assert text == f"<@U0ANA> <!subteam^S0TEAM> {plain}" and plain.startswith("🚨 On-call: ft-abcd could not resume")
    assert action_ids(blocks) == ["finetune_ack", "finetune_resume", "finetune_ondemand", "finetune_stop"]


def test_an_acknowledged_page_keeps_its_words_and_loses_its_buttons() -> None:
    text, blocks = acked_page_layout("🚨 On-call: ft-abcd could not resume", "slack:U0BOB", NOW)
    assert action_ids(blocks) == []
    assert blocks[-1]["elements"][0]["text"] == "✅ Acknowledged by <@U0BOB> at 03:04 UTC"
    assert text.startswith("🚨 On-call") and "<@U0BOB>" in text
    note = notify("ft-abcd", "thread", "acked", **{"by": "slack:U0BOB", "at": NOW.isoformat()})
    assert note_text(job(), note, NOW).startswith("👀 <@U0BOB> acknowledged the page for ft-abcd at 03:04:05 UTC")


def test_a_channel_configured_for_chinese_gets_its_cards_pages_and_dialogs_in_chinese() -> None:
    config = SlackConfig.model_validate({"channels": {"C0CN": {"language": "zh-CN"}}})
    assert config.language_for("C0CN") == "zh-CN" and config.language_for("C0JOBS") == "en"
    assert config.language_for(None) == "en"

    text, blocks = card_layout(job(), NOW, "zh-CN")
    fields = [f["text"] for f in blocks[1]["fields"]]
    assert fields[0].startswith("*状态*") and "State" not in text
    stop = next(e for b in blocks if b["type"] == "actions" for e in b["elements"])
    assert stop["text"]["text"] == "停止" and stop["confirm"]["deny"]["text"] == "取消"
    assert "由 <@U0ANA> 启动" in str(blocks)

    note = notify("ft-abcd", "page", "resume-failed", **{"reason": X, "everyone": "here"})
    said, _plain, page = page_layout(job(JobState.RESUME_FAILED), note, NOW, "zh-CN")
    assert said.startswith("<!here> ") and [e["text"]["text"] for e in page[1]["elements"]][:3] == [
        "确认",
        "恢复",
        "改用按量付费",
    ]
    _text, acked = acked_page_layout("🚨", "slack:U0BOB", NOW, "zh-CN")
    assert acked[-1]["elements"][0]["text"] == "✅ 已由 <@U0BOB> 于 03:04（UTC）确认"
