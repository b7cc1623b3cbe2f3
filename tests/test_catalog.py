"""The message catalogue: every note type in both languages, the languages in step, English as it always was."""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError

from bot.chat import catalog as catalog_module
from bot.chat.catalog import LANGUAGES, en, messages, plain, say, text
from bot.chat.render import card, card_text, message_text, recipes_text
from handlers import caps, commands, decide, failures, job_options, permissions, recipes
from handlers import policy_reasons as policy_wording
from handlers import reconcile as reconcile_module
from handlers.caps import Caps, caps_for, concurrency_refusal, nodes_refusal, price_refusal
from handlers.commands import HELP, HELP_REASON, USAGE, Action, parse
from handlers.decide import ack_command, interrupt_test_command, resume_command, stop_command
from handlers.decide import decide as decide_message
from handlers.errors import ReasonError
from handlers.failures import CODES, Failure
from handlers.jobs import Attempt, ChatRef, CheckpointRef, Job, JobState, Page
from handlers.messages import LaunchFailed, Notify, StartDeadline, dump_message, parse_message
from handlers.notes import (
    Acked,
    CardRefresh,
    ChartNote,
    CompletedNote,
    FailedNote,
    GroupReleased,
    HeldStep,
    HungNote,
    InstanceGone,
    InstanceReleased,
    InterruptedNote,
    InterruptionWarning,
    InterruptTestDone,
    InterruptTestFailed,
    InterruptTestResult,
    InterruptTestStarted,
    NoReports,
    Note,
    NoticeBudgetNote,
    Paged,
    PagerCall,
    Rebalance,
    RebalanceCheckpoint,
    RelaunchPaused,
    Resumed,
    ResumeFailedPage,
    ResumeRequested,
    SpotPolicyNote,
    Stopped,
    StopRequested,
    WarnedBeforeStart,
)
from handlers.oncall import OnCall
from handlers.permissions import cost_refusal, job_refusal, narrowed
from handlers.policy_config import PolicyConfig, Team
from handlers.policy_reasons import POLICY_REASONS
from handlers.reasons import Reason
from handlers.recipes import BUILT_IN, TINY, Parameter, Recipe, find_recipe
from handlers.reconcile import CloudInstance, reconcile
from handlers.reports import Late, StackFrame
from runner.trainer import start_failure
from tests.spot_cases import policy_reasons

NOW = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)
CJK = re.compile(r"[\u4e00-\u9fff]")
PAGE_PERSON = {"name": "ana", "slack": None, "dingtalk": "manager4220", "mobile": None}


def spot_policy_reasons() -> list[Reason]:
    """The reasons of the live spot policy (the job options' errors, also in policy_reasons, are no note)."""
    return [reason for reason in policy_reasons() if reason.key in POLICY_REASONS]


NO_ROOM = Failure.of("launch-failed", error="no capacity")
LATE = Failure.of("start-timeout")
HANG_FRAME = StackFrame(function="_hang_forever", file="/opt/runner/hf/tiny_training.py", line=92)
# A sample of every note type, in each shape its wording has; the union itself says which types exist.
SAMPLES: list[Note] = [
    CardRefresh(cause="progress"),
    InterruptionWarning(instance="i-1", source="aws-imds", deadline=NOW),
    InterruptionWarning(instance="i-1", source="aliyun-metadata", deadline=None),
    InterruptedNote(step=15, seconds={"save": 0.2, "upload": 0.1, "total": 0.3}, saved_in_time=True),
    InterruptedNote(step=10, saved_in_time=False, late=Late(cause="not-asked", why="too-slow"), reached=17, lost=7),
    *(
        InterruptedNote(step=step, seconds={"save": 9.0}, saved_in_time=False, late=late)
        for step in (10, None)
        for late in (
            None,
            Late(cause="upload-failed", error="HTTP 503"),
            Late(cause="not-asked", why="already-saving", step=12),
            Late(cause="not-asked", why="no-rate"),
            Late(cause="not-asked", why="too-slow", need_seconds=95.0, left_seconds=30.0),
            Late(cause="not-asked", why="trainer-exited"),
            Late(cause="not-saved"),
            Late(cause="trainer-gone"),
            Late(cause="not-uploaded", step=12),
        )
    ),
    Resumed(attempt=2, zone="cn-hangzhou-h", step=15, lost=0, downtime=41.5),
    Resumed(attempt=3, zone=None, step=None, lost=2, downtime=9, skipped=1),
    Rebalance(),
    Rebalance(
        signal="scheduled-event",
        event="SystemMaintenance.Reboot",
        due=datetime(2026, 12, 9, 1, 1, tzinfo=UTC),
        action="ahead",
        left_minutes=95.0,
        restart_minutes=6.0,
    ),
    Rebalance(action="short", left_minutes=4.0, restart_minutes=6.0),
    WarnedBeforeStart(instance="i-1", source="aws.ec2"),
    RebalanceCheckpoint(step=20, seconds=1.25),
    NoticeBudgetNote(
        commit_seconds=151.2, notice_seconds=120, save_seconds=31, bytes=112 * 2**30, bytes_per_second=1e9
    ),
    NoticeBudgetNote(commit_seconds=3.4, notice_seconds=2, save_seconds=1.2, bytes=4 * 2**20),
    InstanceGone(instance="i-1"),
    HeldStep(node=0, step=27, rebuilt={"node-1": "seed-step-rank"}),
    HeldStep(node=1, step=27, rebuilt={"node-0": "checkpoint-20"}),
    RelaunchPaused(attempt=2, count=2, limit=3, seconds=60.0),
    HungNote(step=7, seconds=2.1, limit=1.5, frames=[HANG_FRAME, HANG_FRAME], then="restart", restart_from=5),
    HungNote(step=7, seconds=130.0, limit=120.0, then="restart"),
    HungNote(step=3, seconds=130.0, limit=120.0, frames=[HANG_FRAME], then="relaunch"),
    HungNote(step=3, seconds=130.0, limit=120.0, frames=[HANG_FRAME], then="regroup"),
    CompletedNote(output_uri="oss://bucket/jobs/ft-ab12/output/"),
    ChartNote(occasion="completed"),
    ChartNote(occasion="asked", by="slack:U0ANA"),
    FailedNote(reason=Failure.of("trainer-exited", exit_code=3, restarts=2, line="CUDA error"), log_tail=["x"]),
    FailedNote(reason=Failure.of("trainer-not-on-path", program="sft", path="/usr/bin"), exit_code=None),
    Stopped(step=12),
    Stopped(),
    ResumeFailedPage(reason=NO_ROOM, step=0, steps=3, mention=[Paged(**PAGE_PERSON)]),
    ResumeFailedPage(reason=NO_ROOM, step=2, steps=3, everyone="channel"),
    ResumeFailedPage(
        reason=Failure.of("no-progress", count=3, last=Failure.of("interrupted", notice="spot-interruption")),
        step=1,
        steps=3,
    ),
    Acked(by="dingtalk:manager4220", at=NOW),
    Acked(by="pagerduty:Ana Lee", at=NOW, via="pagerduty"),
    PagerCall(
        tool="pagerduty", action="trigger", key="finetune-ft-ab12-2", reason=Failure.of("launch-failed", error="x")
    ),
    PagerCall(tool="opsgenie", action="acknowledge", key="finetune-ft-ab12-2", by="slack:U1"),
    PagerCall(tool="opsgenie", action="resolve", key="finetune-ft-ab12-2"),
    StopRequested(by="dingtalk:manager4220"),
    ResumeRequested(by="slack:U1", market="on-demand"),
    InterruptTestStarted(instance="i-1", by="dingtalk:manager4220"),
    InterruptTestDone(result=InterruptTestResult(instance_id="i-1", way="fis", reference="EXP1", after_seconds=120)),
    InterruptTestDone(result=InterruptTestResult(instance_id="i-1", way="notice", reclaim_at=NOW)),
    InterruptTestFailed(error="FIS refused"),
    # The spot policy (handlers/spot/): every reason it gives, from the code path that gives it.
    *(SpotPolicyNote(reason=reason.key, values=dict(reason.values)) for reason in spot_policy_reasons()),
    # Reconciliation (handlers/reconcile.py): a code and its values, each code in the catalogue.
    InstanceReleased(instance="i-9", why="job-over", values={"job": "ft-ab12", "state": "SUCCEEDED"}),
    InstanceReleased(instance="i-9", why="job-unknown", values={"job": "ft-zz99"}),
    InstanceReleased(instance="i-1", why="moved-on", values={"job": "ft-ab12", "attempt": 1, "current": 2}),
    InstanceReleased(instance="i-1", why="moved-on-untagged", values={"job": "ft-ab12", "current": 2}),
    NoReports(instance="i-2", minutes=31),
    GroupReleased(group="finetune-ft-ab12", why="job-over", values={"job": "ft-ab12", "state": "STOPPED"}),
]
NOTE_TYPES: list[type[BaseModel]] = list(get_args(get_args(Note)[0]))


def job() -> Job:
    first = Attempt(
        number=1,
        instance_id="i-1",
        instance_type="ecs.gn7i-c8g1.2xlarge",
        zone="cn-hangzhou-h",
        price_per_hour=0.42,
        on_demand_price_per_hour=1.68,
        launched_at=NOW - timedelta(hours=1),
        started_at=NOW - timedelta(minutes=58),
        ended_at=NOW - timedelta(minutes=20),
    )
    second = Attempt(
        number=2,
        instance_id="i-2",
        zone="cn-hangzhou-i",
        price_per_hour=0.40,
        on_demand_price_per_hour=1.68,
        launched_at=NOW - timedelta(minutes=19),
        started_at=NOW - timedelta(minutes=18),
        resumed_from_step=15,
    )
    return Job(
        id="ft-ab12",
        recipe="deepseek-7b",
        requested_by="dingtalk:manager4220",
        state=JobState.RUNNING,
        attempts=[first, second],
        step=40,
        total_steps=100,
        loss=0.8123,
        checkpoint=CheckpointRef(step=35, uri="oss://bucket/jobs/ft-ab12/checkpoints/checkpoint-35"),
        interruptions=1,
        downtime_seconds=41.5,
        failure=LATE,
        page=Page(attempt=2, opened_at=NOW, reason=LATE, sent=1, acked_by="dingtalk:manager4220", acked_at=NOW),
    )


def placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def test_both_languages_have_the_same_entries_and_placeholders() -> None:
    en, zh = messages("en"), messages("zh-CN")
    assert en.keys() == zh.keys()
    for key in en:
        assert placeholders(en[key]) == placeholders(zh[key]), key


def test_every_note_type_has_a_sample_and_every_wording_of_the_renderer_is_used() -> None:
    """The samples cover the union (a new note type without one fails here), and every note/late wording of the
    catalogue is reached by some sample (a wording no note can produce is dead, or names a note that drifted)."""
    assert {type(sample) for sample in SAMPLES} == set(NOTE_TYPES)
    used: set[str] = set()
    for lang in LANGUAGES:
        for sample in SAMPLES:
            used |= keys_used(lambda sample=sample, lang=lang: message_text(job(), _notify(sample), NOW, lang))
    worded = {key for key in en.BOT if key.startswith(("note.", "late."))}
    assert worded <= used, sorted(worded - used)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda sample: f"{sample.type}")
def test_every_note_renders_in_every_language_without_a_missing_key(sample: Note) -> None:
    shown = {lang: message_text(job(), _notify(sample), NOW, lang) for lang in LANGUAGES}
    assert all(shown.values())
    english, chinese = shown["en"], shown["zh-CN"]
    assert english != chinese
    assert CJK.search(chinese) and not CJK.search(english)
    assert "None" not in english and "None" not in chinese, shown  # "no checkpoint yet" has its own words


def test_every_reason_of_the_spot_policy_has_a_note_sample() -> None:
    """A reason the policy can give but no sample renders would reach a thread unseen by the tests above."""
    assert {sample.reason for sample in SAMPLES if isinstance(sample, SpotPolicyNote)} == POLICY_REASONS


def test_every_note_of_the_union_survives_the_bus() -> None:
    for sample in SAMPLES:
        note = _notify(sample)
        assert parse_message(dump_message(note)) == note


def test_a_malformed_note_is_refused_by_the_bus_parser() -> None:
    good = dump_message(_notify(Stopped(step=3)))
    for bad in (
        {**good, "note": {"type": "no-such-note"}},
        {**good, "note": {"type": "stopped", "step": "three"}},
        {**good, "note": {"type": "resumed"}},  # attempt is required
        {**good, "note": {"type": "stopped", "note": "a sentence"}},  # no field beyond the type's own
        {**good, "note": {"type": "spot-policy", "reason": "because I said so"}},  # a sentence, not a reason key
        {key: value for key, value in good.items() if key != "note"},
    ):
        with pytest.raises(ValidationError):
            parse_message(bad)


@pytest.mark.parametrize("filled", [True, False], ids=["every-field", "only-required"])
@pytest.mark.parametrize("note_type", NOTE_TYPES, ids=lambda note_type: note_type.__name__)
def test_an_instance_made_from_each_type_of_the_union_renders_in_every_language(
    note_type: type[BaseModel], filled: bool
) -> None:
    """Made from the type's own fields (every one filled, or only the required ones): no hand-kept list to drift.
    A reconciliation note's ``values`` fill its code's sentence: those come from the samples above (reached by
    the code paths in :func:`reconcile_reasons`)."""
    if note_type in (InstanceReleased, GroupReleased, SpotPolicyNote):
        pytest.skip("values depend on the code (the policy's reason): see SAMPLES")
    sample = made(note_type, filled)
    for lang in LANGUAGES:
        shown = message_text(job(), _notify(sample), NOW, lang)  # type: ignore[arg-type]
        assert shown and "None" not in shown, (lang, shown)


def made(model: type[BaseModel], filled: bool) -> BaseModel:
    values = {
        name: _value(field.annotation, filled)
        for name, field in model.model_fields.items()
        if name != "type" and (filled or field.is_required())
    }
    return model(**values)


def _value(annotation: Any, filled: bool) -> Any:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:  # a capped field (handlers/reports.py): the type it caps
        return _value(args[0], filled)
    if origin is Literal:
        return args[0]
    if origin in (Union, UnionType):
        return _value(next(arg for arg in args if arg is not type(None)), filled)
    if origin is list:
        return [_value(args[0], filled)]
    if origin is dict:
        return {"save": 1.5} if args[1] is float else {"node-1": _value(args[1], filled)}
    if annotation is Failure:  # its values depend on its code: one with none
        return Failure.of("start-timeout")
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return made(annotation, filled)
    return {str: "x-1", int: 7, float: 2.5, bool: True, datetime: NOW}[annotation]


def _notify(note: Note) -> Notify:
    channel = "card" if isinstance(note, CardRefresh) else "page" if isinstance(note, ResumeFailedPage) else "thread"
    return Notify(job_id="ft-ab12", channel=channel, note=note)


def keys_used(render: Callable[[], str]) -> set[str]:
    """The catalogue keys ``render`` looks up (the real lookups, recorded)."""
    seen: set[str] = set()
    real = catalog_module._MESSAGES
    recording = {lang: _Recording(table, seen) for lang, table in real.items()}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(catalog_module, "_MESSAGES", recording)
        render()
    return seen


class _Recording(dict[str, str]):
    def __init__(self, table: Mapping[str, str], seen: set[str]) -> None:
        super().__init__(table)
        self.seen = seen

    def __getitem__(self, key: str) -> str:
        self.seen.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.seen.add(key)
        return super().get(key, default)


def test_the_card_has_no_english_label_or_state_in_chinese() -> None:
    for state in JobState:
        shown = card(job().model_copy(update={"state": state}), NOW, "zh-CN")
        labels = [label for label, _ in shown.fields]
        assert len(labels) >= 8 and all(CJK.search(label) and not re.search("[A-Za-z]", label) for label in labels)
        state_value = shown.fields[0][1]
        assert CJK.search(state_value) and not re.search("[A-Za-z]", state_value), state_value
    words = {key: value for key, value in messages("zh-CN").items() if key.startswith(("button.", "market."))}
    assert all(not re.search("[A-Za-z]", value) for value in words.values()), words


def test_english_stays_the_default_and_word_for_word() -> None:
    shown = plain(card_text(job(), NOW))  # as a platform without mentions shows it
    assert shown == plain(card_text(job(), NOW, "en"))
    assert shown.splitlines() == [
        "ft-ab12 · deepseek-7b",
        "  State: 🟢 RUNNING",
        "  Instance: i-2 · cn-hangzhou-i (spot, attempt 2)",
        "  Price: $0.40/h",
        "  Step: ▰▰▰▰▱▱▱▱▱▱ 40% · 40/100 · loss 0.8123",
        "  ETA: 43 min",
        "  Cost: $0.4067 · saving 75% vs on-demand",
        "  Checkpoint: step 35 · oss://bucket/jobs/ft-ab12/checkpoints/checkpoint-35",
        "  Interruptions: 1 · 0 steps lost · 42s downtime",
        "  On-call: acknowledged by dingtalk:manager4220 at 08:30:00 UTC",
    ]
    warning = Notify(job_id="ft-ab12", channel="alert", note=SAMPLES[1])
    assert message_text(job(), warning, NOW) == (
        "⚠️ Spot interruption warning for ft-ab12 on i-1 in cn-hangzhou-h (from aws-imds); the machine goes at "
        "08:30:00 UTC. Checkpointing now."
    )
    assert card_text(job(), NOW, "zh-CN").splitlines()[1] == "  状态: 🟢 运行中"


# -- what the handlers say to a person (handlers/reasons.py), and the bot's answers to commands ------------


def _parse_error(text: str) -> Reason:
    with pytest.raises(ReasonError) as caught:
        parse(text)
    assert caught.value.reason.key.startswith("usage.")
    return caught.value.reason


def _recipe_error(call: Callable[[], object]) -> Reason:
    with pytest.raises(ReasonError) as caught:
        call()
    assert caught.value.reason.key.startswith("recipe.")
    return caught.value.reason


def reconcile_reasons() -> list[Reason]:
    """Each reason reconciliation gives, from :func:`handlers.reconcile.reconcile` on a listing that calls for it."""
    running = job().model_copy(update={"updated_at": NOW - timedelta(minutes=1)})
    silent = running.model_copy(update={"updated_at": NOW - timedelta(minutes=40)})
    over = running.model_copy(update={"state": JobState.SUCCEEDED})

    def listed(instance: str, job_id: str, attempt: int | None, state: str = "running") -> CloudInstance:
        return CloudInstance(instance, state, job_id, attempt, launched_at=NOW - timedelta(hours=1))

    cases = [
        ([running], []),  # not-listed
        ([running], [listed("i-2", "ft-ab12", 2, "terminated")]),  # listed-as
        ([silent], [listed("i-2", "ft-ab12", 2)]),  # silent
        ([], [listed("i-9", "ft-zz99", 1)]),  # job-unknown
        ([over], [listed("i-2", "ft-ab12", 2)]),  # job-over
        ([running], [listed("i-2", "ft-ab12", 2), listed("i-1", "ft-ab12", 1)]),  # moved-on
        ([running], [listed("i-2", "ft-ab12", 2), listed("i-1", "ft-ab12", None)]),  # moved-on-untagged
    ]
    reasons = [action.reason for jobs, instances in cases for action in reconcile(jobs, instances, NOW)]
    assert len(reasons) == len(cases)
    return reasons


def handler_reasons() -> list[Reason]:
    """Every kind of Reason the handlers give, each made by the real code path that gives it."""
    running = job().model_copy(update={"state": JobState.RUNNING, "page": None})
    failed = running.model_copy(update={"state": JobState.RESUME_FAILED})
    acked = failed.model_copy(update={"page": Page(attempt=2, opened_at=NOW, reason=LATE, acked_by="slack:U1")})
    pending = running.model_copy(update={"state": JobState.PENDING, "attempts": []})
    stopped = running.model_copy(update={"state": JobState.STOPPED})
    bare = Recipe(name="bare", description="d", model="m", command=["true"])
    ignored = [
        stop_command(stopped, "slack:U1", NOW),
        interrupt_test_command(pending, "slack:U1", NOW),
        interrupt_test_command(running, "slack:U1", NOW, node=1),  # node= of a one-node job
        ack_command(running, "slack:U1", NOW),
        ack_command(failed, "slack:U1", NOW),
        ack_command(acked, "slack:U2", NOW),
        resume_command(running, "slack:U1", False, NOW),
    ]
    policy = PolicyConfig(allow={"start": []}, max_total_nodes=8, max_hourly_price=1.0)
    elsewhere = ChatRef(platform="dingtalk", channel="cidELSEWHERE==")
    teamed = PolicyConfig(teams={"ml": Team(members=["dingtalk:alice"])})
    asked: list[tuple[Action, Job]] = [("logs", job()), ("stop", job()), ("ack", acked)]  # channel, owner, page
    reasons = [
        HELP_REASON,
        *(_parse_error(text) for text in ("x" * 2001, "deploy prod", "status a b", "resume ft-7k2q now", "start")),
        *(_parse_error(text) for text in ("start BAD/x", "start tiny lr", "start tiny a=1 a=2", "stop job;rm")),
        *(_parse_error(text) for text in ("list all", "logs", "costs 90d", "interrupt-test ft-7k2q node=99")),
        _parse_error("stat ft-7k2q"),  # a mistyped command: the one it most likely meant
        _recipe_error(lambda: find_recipe("llama-70b", dict(BUILT_IN))),
        _recipe_error(lambda: TINY.resolve({"batch": "1"})),
        _recipe_error(lambda: bare.resolve({"batch": "1"})),
        _recipe_error(lambda: TINY.resolve_values({"gone": 1})),
        *(_recipe_error(lambda o=o: TINY.resolve(o)) for o in ({"steps": "x"}, {"lr": "x"}, {"lr": "9"}, {"lr": "0"})),
        _recipe_error(lambda: Parameter(type="bool", default=True).parse("flag", "maybe")),
        _recipe_error(lambda: Parameter(type="str", default="a", choices=["a", "b"]).parse("mode", "c")),
        _recipe_error(lambda: Parameter(type="str", default="a").parse("dataset", "a;b")),
        _recipe_error(lambda: Parameter(type="str", default="a").parse("dataset", "--push_to_hub")),
        _recipe_error(lambda: BUILT_IN["deepseek-7b"].resolve({"model": "someone/evil"})),
        _recipe_error(lambda: TINY.resolve({"sharded": "true"})),
        recipes.WORDING("recipe.not-str", name="mode", raw="x"),  # a str parameter takes any text: never raised
        narrowed(policy, "dingtalk:bob", "start"),
        *(cost_refusal(teamed, "dingtalk:bob", team) for team in ("nope", "ml", None)),
        *(job_refusal(policy, OnCall(), "dingtalk:bob", elsewhere, action, item, NOW) for action, item in asked),
        *(reason for team in (None, "ml") for reason in caps_reasons(caps_for(policy, 1, team, "dingtalk:bob"))),
        *(change.reason for change in ignored),
        *policy_reasons(),
        *reconcile_reasons(),
        *(failure.reason() for failure in failure_samples()),
    ]
    assert all(reason is not None for reason in reasons)
    return [reason for reason in reasons if reason is not None]


def caps_reasons(caps: Caps) -> list[Reason | None]:
    """Every refusal of the caps (handlers/caps.py) for a job of ``caps``: its nodes, its price, each node cap."""
    return [
        nodes_refusal(caps, "tiny", 64),
        price_refusal(caps, 1.5, 2),
        concurrency_refusal(caps, "group", 5, 1),
        concurrency_refusal(caps, "total", 8, 1),
    ]


def failure_samples() -> list[Failure]:
    """A failure of every code, from the code path that gives it where that is cheap to reach (the bot's own
    decisions, the runner's check of the trainer's program), else as the runner makes it."""
    launching = Job(
        id="ft-ab12",
        recipe="tiny",
        requested_by="u",
        state=JobState.PROVISIONING,
        attempts=[Attempt(number=1)],
    )
    decided = [
        decide_message(
            launching.model_copy(update={"state": JobState.PENDING}),
            LaunchFailed(job_id="ft-ab12", attempt=1, reason="InsufficientInstanceCapacity"),
            NOW,
        ),
        decide_message(launching, StartDeadline(job_id="ft-ab12", attempt=1, due=NOW), NOW),
    ]
    found = [change.job.failure for change in decided]
    assert all(isinstance(failure, Failure) for failure in found), found
    env = {"PATH": "/usr/bin"}
    return [
        *(failure for failure in found if isinstance(failure, Failure)),
        start_failure("sft", env),
        start_failure("/opt/bin/sft", env),
        start_failure("/opt/bin/sft", env, PermissionError()),
        start_failure("/opt/bin/sft", env, OSError(8, "Exec format error")),
        Failure.of(  # tests/test_trainer_sandbox.py
            "trainer-out-of-reach",
            program="/root/.venv/bin/python",
            user="finetune-train",
            setting="FINETUNE_TRAINER_USER",
        ),
        Failure.of("replacement-gone", instance="i-2"),
        Failure.of("metadata-guard-failed", error="iptables exited 4"),  # tests/test_metadata_guard.py
        Failure.of("capacity", error="InsufficientInstanceCapacity"),  # an attempt's end (tests/test_spot_decide.py)
        Failure.of("no-progress", count=3, last=Failure.of("interrupted", notice="spot-interruption")),
        Failure.of("no-progress", count=2, last=Failure.of("instance-gone", detail="aws-eventbridge")),
        Failure.of("no-progress", count=4, last=Failure.of("hung", step="7")),  # handlers/decide/inputs.py
        Failure.of("storage-unreachable", error="HTTP 503"),
        Failure.of("trainer-exited", exit_code=1, restarts=2, line="CUDA out of memory"),
        Failure.of("trainer-exited-silent", exit_code=1, restarts=0),
        Failure.of("output-not-stored", error="AccessDenied"),
    ]


def codes_in(failure: Failure) -> set[str]:
    nested = (codes_in(value) for value in failure.values.values() if isinstance(value, Failure))
    return {failure.code}.union(*nested)


def test_every_failure_code_has_wording_in_every_language_and_a_sample() -> None:
    """Generated from the codes' union: a code added without its English, or without a word in any language of
    the catalogue, fails here (and its sample must fill the sentence exactly: ``Failure`` checks that)."""
    assert set(failures.WORDING.sentences) == {f"failure.{code}" for code in CODES}
    for lang in LANGUAGES:
        missing = [code for code in CODES if f"failure.{code}" not in messages(lang)]
        assert not missing, (lang, missing)
    assert set().union(*(codes_in(failure) for failure in failure_samples())) == set(CODES)


def test_a_failure_whose_values_do_not_fill_its_sentence_is_refused() -> None:
    for values in ({}, {"error": "x", "extra": 1}, {"wrong": "x"}):
        with pytest.raises(ValidationError):
            Failure(code="launch-failed", values=values)
    with pytest.raises(ValidationError):
        Failure.model_validate({"code": "no-such-code", "values": {}})


def test_a_failure_keeps_the_english_it_always_had_and_the_quoted_detail_as_given() -> None:
    nested = Failure.of("no-progress", count=3, last=Failure.of("interrupted", notice="spot-interruption"))
    assert nested.english == (
        "3 attempt(s) in a row ended without progress, the last one interrupted: spot-interruption; not relaunching"
    )
    assert (
        say("zh-CN", nested.reason())
        == "已连续 3 次尝试没有任何进展，最后一次被中断（spot-interruption）；不再重新启动"
    )
    launch = Failure.of("launch-failed", error="InsufficientInstanceCapacity: no p5 in us-east-1a")
    assert say("zh-CN", launch.reason()) == "实例启动失败：InsufficientInstanceCapacity: no p5 in us-east-1a"
    assert Failure.model_validate_json(nested.model_dump_json()) == nested  # a nested failure survives storage


def test_a_jobs_failure_is_shown_from_its_code_in_the_channels_language() -> None:
    coded = job().model_copy(update={"state": JobState.RESUME_FAILED, "failure": Failure.of("start-timeout")})
    assert dict(card(coded, NOW, "zh-CN").fields)["问题"] == "运行器没有按时报告已启动"
    assert dict(card(coded, NOW, "en").fields)["Problem"] == "the runner did not report started in time"
    bus = dump_message(_notify(ResumeFailedPage(reason=NO_ROOM)))
    assert "(launch failed: no capacity)" in message_text(coded, parse_message(bus), NOW, "en")  # type: ignore[arg-type]


def keys_in(reason: Reason) -> set[str]:
    nested = (keys_in(value) for value in reason.values.values() if isinstance(value, Reason))
    return {reason.key}.union(*nested)


def test_the_english_of_the_handlers_is_the_catalogue_english_and_no_key_is_in_both_tables() -> None:
    tables = [commands.WORDING, caps.WORDING, permissions.WORDING, recipes.WORDING, decide.WORDING]
    tables += [job_options.WORDING]
    tables += [
        policy_wording.WORDING,
        reconcile_module.WORDING,
        failures.WORDING,
    ]
    assert {key: value for table in tables for key, value in table.sentences.items()} == en.HANDLERS
    assert sum(len(table.sentences) for table in tables) == len(en.HANDLERS)  # no handler key twice
    assert en.BOT.keys().isdisjoint(en.HANDLERS)
    assert all(messages("en")[key] == value for key, value in en.HANDLERS.items())
    assert set(messages("zh-CN")) >= set(en.HANDLERS)


def test_every_reason_renders_in_both_languages_english_exactly_as_str() -> None:
    reasons = handler_reasons()
    assert set().union(*(keys_in(reason) for reason in reasons)) == set(en.HANDLERS)  # every key is exercised
    # The words a person types stay as they are (and an English word inside one of them, "cost" in "costs").
    kept = {*USAGE, *job_options.JOB_OPTIONS, "finetune", "demand", "team", "node", "true", "false", *caps.SETTINGS}
    for reason in reasons:
        english, chinese = say("en", reason), say("zh-CN", reason)
        assert english == str(reason) == reason.english
        assert CJK.search(chinese) and not CJK.search(english), reason.key
        literal = "".join(part for part, *_ in string.Formatter().parse(messages("en")[reason.key]))
        typed = {w for w in re.findall(r"[A-Za-z]{3,}", literal) if any(w in word for word in kept)}
        leftover = {w for w in re.findall(r"[A-Za-z]{3,}", literal) if w not in typed and w in chinese}
        assert not leftover, (reason.key, chinese, leftover)


def test_help_and_usage_in_chinese_keep_the_words_to_type() -> None:
    english = say("en", HELP_REASON).splitlines()
    assert say("en", HELP_REASON) == HELP and len(english) == len(USAGE)
    for line, (verb, usage) in zip(english, USAGE.items(), strict=True):  # each command, one line saying what
        assert line == f"/finetune {usage} — {commands.DOES[verb]}"
    lines = say("zh-CN", HELP_REASON).splitlines()
    assert [line.split(" —— ")[0].split()[1] for line in lines] == list(USAGE)
    assert lines[-3] == "/finetune resume <任务> [on-demand] —— 从检查点继续失败或已停止的任务（可改用按量付费）"
    assert say("zh-CN", _parse_error("stop a b")) == "stop：需要且只能带一个任务编号。用法：/finetune stop <任务>"
    state = say("zh-CN", stop_command(job().model_copy(update={"state": JobState.STOPPED}), "u", NOW).reason)
    assert state == "任务当前状态为 已停止"  # a job state inside a reason is said in the channel's language


# The bot's own answers, with values as Bot.command gives them: the English as the bot always wrote it.
REPLIES: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "reply.starting",
        {"job": "ft-ab12", "recipe": "tiny", "params": "steps=30 lr=0.05"},
        "Starting ft-ab12: tiny (steps=30 lr=0.05)",
        "正在启动 ft-ab12：tiny（steps=30 lr=0.05）",
    ),
    (
        "reply.ok",
        {"action": "stop", "job": "ft-ab12", "state": "STOPPING"},
        "OK: stop ft-ab12 (STOPPING)",
        "已受理：stop ft-ab12（STOPPING）",
    ),
    ("reply.no-job", {"job": "ft-ab12"}, "no job ft-ab12", "找不到任务 ft-ab12"),
    (
        "reply.chart",
        {"job": "ft-ab12"},
        "📈 The chart of ft-ab12 is on its way to the job's thread.",
        "📈 任务 ft-ab12 的图表即将发到它的消息串里。",
    ),
    (
        "reply.chart-file",
        {"job": "ft-ab12"},
        "📈 Drawing the chart of ft-ab12: the path of its PNG file follows.",
        "📈 正在绘制任务 ft-ab12 的图表：PNG 文件的路径随后给出。",
    ),
    (
        "reply.logs",
        {"job": "ft-ab12", "count": 2, "attempt": 3},
        "📜 ft-ab12: the last 2 line(s) of the trainer's log (attempt 3)",
        "📜 ft-ab12：训练程序日志的最后 2 行（第 3 次尝试）",
    ),
    (
        "reply.no-logs",
        {"job": "ft-ab12", "history": "/finetune history ft-ab12"},
        "ft-ab12: no trainer has written a log yet; /finetune history ft-ab12 shows the job's history",
        "ft-ab12：训练程序还没有写日志；/finetune history ft-ab12 可查看任务记录",
    ),
    (
        "reply.logs-elsewhere",
        {"job": "ft-ab12", "cloud": "aws", "history": "/finetune history ft-ab12"},
        "ft-ab12: the trainer's log stays on its instance on aws, out of the bot's reach; /finetune history ft-ab12 "
        "shows the job's history",
        "ft-ab12：训练程序的日志留在 aws 上的实例里，机器人读不到；/finetune history ft-ab12 可查看任务记录",
    ),
    ("reply.refused", {"why": "x"}, "⛔ x", "⛔ x"),  # only a frame: the reason inside is in the language
    ("reply.ignored", {"action": "ack", "job": "ft-ab12", "why": "y"}, "⛔ ack ft-ab12: y", "⛔ ack ft-ab12：y"),
    ("reply.no-jobs", {}, "no jobs yet: /finetune start tiny", "还没有任务：/finetune start tiny"),
    (
        "reply.list-line",
        {"job": "ft-ab12", "state": "RUNNING", "recipe": "tiny", "step": 3, "total": "?"},
        f"{'ft-ab12'}  {'RUNNING':<13} {'tiny':<12} step 3/?",  # the f-string the bot used to write
        "ft-ab12  RUNNING  tiny  第 3/? 步",
    ),
    (
        "reply.slow-down.commands",
        {"limit": 30, "wait": 2},
        "⛔ slow down: at most 30 commands a minute; try again in 2 s",
        "⛔ 请慢一点：每分钟最多 30 条命令；请 2 秒后再试",
    ),
    (
        "reply.slow-down.starts",
        {"limit": 5, "wait": 12},
        "⛔ slow down: at most 5 starts a minute; try again in 12 s",
        "⛔ 请慢一点：每分钟最多启动 5 个任务；请 12 秒后再试",
    ),
    ("chat.starting", {}, "The bot is still starting; try again in a moment.", "机器人还在启动中，请稍后再试。"),
    ("slack.working", {}, "⏳ Working on it…", "⏳ 正在处理…"),
    (
        "slack.failed",
        {},
        "⚠️ That did not work: the bot hit an internal error (it is logged). Try again in a moment.",
        "⚠️ 操作未成功：机器人内部出错（已记录日志）。请稍后再试。",
    ),
    (
        "slack.bad-button",
        {"value": "x;y"},
        "⛔ that button does not name a job ('x;y')",
        "⛔ 这个按钮没有指明任务（'x;y'）",
    ),
]


@pytest.mark.parametrize(("key", "values", "english", "chinese"), REPLIES, ids=[key for key, *_ in REPLIES])
def test_every_answer_of_the_bot_renders_in_both_languages(
    key: str, values: dict[str, Any], english: str, chinese: str
) -> None:
    assert text("en", key, **values) == english
    assert text("zh-CN", key, **values) == chinese


def test_every_answer_key_of_the_bot_is_tested_above() -> None:
    answers = {key for key in en.BOT if key.startswith("reply.")} | {"chat.starting", "slack.working"}
    assert answers <= {key for key, *_ in REPLIES}


def test_help_lists_the_recipes_with_their_parameters_in_both_languages() -> None:
    custom = Recipe(
        name="qwen-lora",
        description="LoRA of Qwen",
        model="m",
        command=["swift", "{mode}"],
        parameters={"mode": Parameter(type="str", default="a", choices=["a", "b"], help="which")},
    )
    bare = Recipe(name="bare", description="no knobs", model="m", command=["true"])
    for lang in LANGUAGES:
        shown = recipes_text([TINY, custom, bare], lang).splitlines()
        assert [line.split()[0] for line in shown if line.startswith("  ") and not line.startswith("   ")] == [
            "bare",
            "qwen-lora",
            "tiny",
        ]
        assert any(line.strip().startswith("steps=30  int") and "1…10000" in line for line in shown), shown
        assert any(line.strip().startswith("mode=a  str") and "a, b" in line and "which" in line for line in shown)
        assert any("2147483647" in line for line in shown)  # bounds as written, not 2.1e+09
    assert CJK.search(recipes_text([bare], "zh-CN")) and not CJK.search(recipes_text([bare], "en"))
