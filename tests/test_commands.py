"""The command grammar, recipes' typed overrides and the permission rules: pure decisions, no I/O."""

from __future__ import annotations

import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from handlers.commands import Command, parse
from handlers.errors import ReasonError
from handlers.recipes import BUILT_IN, TINY, Parameter, Recipe, find_recipe


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", Command("help")),
        ("/finetune help", Command("help")),
        ("start tiny", Command("start", recipe="tiny")),
        (
            "START deepseek-7b lr=2e-4 epochs=2",
            Command("start", recipe="deepseek-7b", overrides={"lr": "2e-4", "epochs": "2"}),
        ),
        ("stop FT-7K2Q", Command("stop", job_id="ft-7k2q")),
        ("interrupt-test ft-7k2q", Command("interrupt-test", job_id="ft-7k2q")),
        ("interrupt-test ft-7k2q node=0", Command("interrupt-test", job_id="ft-7k2q", node=0)),
        ("interrupt-test ft-7k2q NODE=12", Command("interrupt-test", job_id="ft-7k2q", node=12)),
        ("status", Command("status")),
        ("status ft-7k2q", Command("status", job_id="ft-7k2q")),
        ("list", Command("list")),
        ("logs ft-7k2q", Command("logs", job_id="ft-7k2q")),
        ("history ft-7k2q", Command("history", job_id="ft-7k2q")),
        ("ack ft-7k2q", Command("ack", job_id="ft-7k2q")),
        ("resume ft-7k2q", Command("resume", job_id="ft-7k2q")),
        ("resume ft-7k2q on-demand", Command("resume", job_id="ft-7k2q", on_demand=True)),
    ],
)
def test_commands_parse(text: str, expected: Command) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("start", "start needs a recipe. Usage: /finetune start <recipe>"),
        ("start tiny lr", "'lr' is not key=value"),
        ("start tiny lr=1 lr=2", "lr is given twice"),
        ("start tiny x=$(rm -rf /)", "is not key=value"),
        ("start ../etc", "is not a recipe name"),
        ("stop", "stop takes exactly one job id"),
        ("interrupt-test ft-7k2q node=64", "optionally node=K"),
        ("interrupt-test ft-7k2q node=-1", "optionally node=K"),
        ("interrupt-test ft-7k2q 1", "optionally node=K"),
        ("interrupt-test ft-7k2q node=1 node=0", "takes exactly one job id"),
        ("stop job;rm", "is not a job id"),
        ("resume ft-7k2q now", "optionally the word on-demand"),
        ("list all", "list takes no arguments"),
        ("deploy prod", "unknown command 'deploy'\n/finetune start <recipe>"),
        # A mistyped command: the one it begins, else the closest spelling; the help stays one command away.
        ("stat ft-7k2q", "unknown command 'stat': did you mean status? (/finetune help lists every command)"),
        ("STATS", "did you mean status?"),
        ("sta", "did you mean start?"),
        ("lgos ft-7k2q", "did you mean logs?"),
        ("histroy ft-7k2q", "did you mean history?"),
        ("intterupt-test ft-7k2q", "did you mean interrupt-test?"),
    ],
)
def test_malformed_commands_answer_with_usage(text: str, words: str) -> None:
    with pytest.raises(ReasonError) as caught:
        parse(text)
    assert words in str(caught.value) and caught.value.reason.key.startswith("usage.")


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=300))
def test_fuzzed_input_never_crashes_and_yields_only_safe_values(text: str) -> None:
    try:
        command = parse(text)
    except ReasonError as refused:
        assert refused.reason.key.startswith("usage.")
        return
    if command.job_id is not None:
        assert command.job_id.startswith("ft-")
        assert all(ch.isalnum() or ch == "-" for ch in command.job_id)
    if command.recipe is not None:
        assert "/" not in command.recipe and not command.recipe.startswith(".")
    for key, value in command.overrides.items():
        assert key.isidentifier() and not any(ch.isspace() for ch in value)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(TINY.parameters)), st.text(max_size=40), max_size=5))
def test_fuzzed_overrides_either_refused_or_typed_and_one_argv_item_each(overrides: dict[str, str]) -> None:
    try:
        values = TINY.resolve(overrides)
    except ReasonError as refused:
        assert refused.reason.key.startswith("recipe.")
        return
    argv = TINY.argv(values, python=sys.executable)
    assert len(argv) == len(TINY.command)  # a value never becomes a second argument
    assert argv[0] == "${FINETUNE_PYTHON}"  # the runner's interpreter, put in by the runner on the host


@pytest.mark.parametrize(
    ("name", "raw", "first"),
    [
        ("dataset", "--push_to_hub", "-"),
        ("dataset", "-x", "-"),
        ("dataset", "@/etc/finetune-args", "@"),  # argparse's fromfile_prefix_chars
        ("dataset", "+override", "+"),
        ("dataset", "#2000", "#"),
        ("dataset", ":memory:", ":"),
        ("lr", "-1e-05", "-"),  # a negative number could be read as an option too ("-1e-05" is no number to argparse)
        ("epochs", "+2", "+"),
    ],
)
def test_override_values_never_start_like_an_option(name: str, raw: str, first: str) -> None:
    with pytest.raises(ReasonError) as refused:
        BUILT_IN["deepseek-7b"].resolve({name: raw})
    assert str(refused.value) == f"{name} may not start with {first!r}: a trainer could read it as an option"


def free_dataset_recipe() -> Recipe:
    """deepseek-7b whose dataset has no allow list: any value that looks like a value, as a team's recipe may."""
    built_in = BUILT_IN["deepseek-7b"]
    free = Parameter(type="str", default="a", many=True)
    return built_in.model_copy(update={"parameters": {**built_in.parameters, "dataset": free}})


def test_values_that_start_like_a_value_are_kept() -> None:
    recipe = free_dataset_recipe()
    for dataset in ("AI-ModelScope/alpaca-gpt4-data-zh#500", "./data/train.jsonl", "/mnt/data/x-y", "_local", "9x"):
        values = recipe.resolve({"dataset": dataset})
        argv = recipe.argv(values, python="python")
        assert argv[argv.index("--dataset") + 1] == dataset


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
@example("0,0")  # two entries: two argv items (what a fresh run once drew, and the old assertion got wrong)
def test_fuzzed_string_overrides_never_become_an_option(dataset: str) -> None:
    recipe = free_dataset_recipe()
    try:
        values = recipe.resolve({"dataset": dataset})
    except ReasonError as refused:
        assert refused.reason.key.startswith("recipe.")
        return
    argv = recipe.argv(values, python="python")
    entries = dataset.split(",")  # the dataset takes many values: one argv item each, right after the flag
    assert len(argv) == len(recipe.command) + len(entries) - 1
    start = argv.index("--dataset") + 1
    passed = argv[start : start + len(entries)]
    assert passed == entries and all(item[0] not in "-@+" for item in passed)


def test_recipes_refuse_unknown_and_out_of_range_overrides() -> None:
    with pytest.raises(ReasonError, match=r"unknown recipe 'llama-70b'; known recipes: deepseek-7b, tiny"):
        find_recipe("llama-70b", BUILT_IN)
    with pytest.raises(ReasonError, match="has no parameter 'batch'"):
        TINY.resolve({"batch": "4"})
    with pytest.raises(ReasonError, match=r"lr=5\.0 is above the maximum 1"):
        TINY.resolve({"lr": "5"})
    with pytest.raises(ReasonError, match="steps must be an int"):
        TINY.resolve({"steps": "ten"})
    with pytest.raises(ReasonError, match="lr must be a float"):
        TINY.resolve({"lr": "nan"})
    with pytest.raises(ReasonError, match="may only use"):
        BUILT_IN["deepseek-7b"].resolve({"dataset": "a;b"})
    values = TINY.resolve({"steps": "12", "lr": "0.01"})
    assert values["steps"] == 12 and values["lr"] == 0.01 and values["save_steps"] == 5
    argv = TINY.argv(values, python="/usr/bin/python3")
    assert argv[:3] == ["${FINETUNE_PYTHON}", "-m", "runner.hf.tiny"]
    assert argv[argv.index("--max-steps") + 1] == "12"
