"""The built-in recipes as the bot renders them: ms-swift 4.x flags, the guide's defaults, list and path checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from handlers.errors import ReasonError
from handlers.recipes import DEEPSEEK_7B, TINY, Parameter, Recipe
from runner.trainer import expand_argv

RUNNER_VALUES = {
    "FINETUNE_OUTPUT_DIR": "/w/output",
    "FINETUNE_RESUME_FROM": "/w/output/checkpoint-40",
    "FINETUNE_PROGRESS_FILE": "/w/progress.jsonl",
    "FINETUNE_STOP_FILE": "/w/stop-request",
    "FINETUNE_SWIFT_PLUGIN": "/opt/finetune/lib/runner/swift/finetune_spot_plugin.py",
    "FINETUNE_PYTHON": "/opt/finetune/bin/python",
}


def option(argv: list[str], flag: str) -> list[str]:
    """The values after ``flag`` up to the next flag."""
    start = argv.index(flag) + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    return argv[start:end]


def test_deepseek_defaults_are_the_guides_in_ms_swift_4_flags() -> None:
    argv = DEEPSEEK_7B.argv(DEEPSEEK_7B.resolve({}), python="/usr/bin/python3")
    # The runner's own interpreter, and no `swift` wrapper between the runner and the trainer.
    assert argv[:3] == ["${FINETUNE_PYTHON}", "-m", "swift.cli.sft"]
    assert "--train_type" not in argv and option(argv, "--tuner_type") == ["lora"]
    assert option(argv, "--dataset") == [
        "AI-ModelScope/alpaca-gpt4-data-zh#500",
        "AI-ModelScope/alpaca-gpt4-data-en#500",
        "swift/self-cognition#500",
    ]
    guide = {
        "--model": "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
        "--torch_dtype": "bfloat16",
        "--num_train_epochs": "1",
        "--per_device_train_batch_size": "1",
        "--learning_rate": "0.0001",
        "--lora_rank": "8",
        "--lora_alpha": "32",
        "--target_modules": "all-linear",
        "--gradient_accumulation_steps": "16",
        "--save_steps": "10",
        "--save_total_limit": "5",
        "--logging_steps": "5",
        "--max_length": "2048",
        "--warmup_ratio": "0.05",
        "--dataloader_num_workers": "4",
        "--add_version": "false",
        "--system": "You are a helpful assistant.",
    }
    assert {flag: option(argv, flag) for flag in guide} == {flag: [value] for flag, value in guide.items()}
    assert option(argv, "--external_plugins") == ["${FINETUNE_SWIFT_PLUGIN}"]
    assert option(argv, "--callbacks") == ["spot_checkpoint"]


def test_deepseek_takes_a_local_model_local_data_sets_and_float32() -> None:
    values = DEEPSEEK_7B.resolve(
        {
            "model": "/mnt/oss-data/DeepSeek-R1-Distill-Qwen-7B",
            "dataset": "/mnt/oss-data/alpaca-gpt4-data-zh#500,/mnt/oss-data/self-cognition#500",
            "dtype": "float32",
        }
    )
    argv = DEEPSEEK_7B.argv(values, python="python3")
    assert option(argv, "--model") == ["/mnt/oss-data/DeepSeek-R1-Distill-Qwen-7B"]
    assert option(argv, "--dataset") == ["/mnt/oss-data/alpaca-gpt4-data-zh#500", "/mnt/oss-data/self-cognition#500"]
    assert option(argv, "--torch_dtype") == ["float32"]


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("model", "--report_to", "may not start with '-'"),  # would be read as a flag
        ("dataset", "a#5,--output_dir", "may not start with '-'"),
        ("dataset", "a#5,,b", "may only use"),
        ("model", "/mnt/../etc/shadow", "may only use"),
        ("dataset", "a b", "may only use"),
        ("dtype", "float64", "must be one of bfloat16, float16, float32"),
        ("lora_dropout", "0.9", "above the maximum 0.5"),
    ],
)
def test_deepseek_refuses_what_could_become_a_flag_or_leave_its_paths(name: str, raw: str, message: str) -> None:
    with pytest.raises(ReasonError, match=message):
        DEEPSEEK_7B.resolve({name: raw})


def test_a_list_parameter_must_fill_a_whole_argv_item_and_be_text() -> None:
    with pytest.raises(ValidationError, match="must be a whole argv item"):
        Recipe(
            name="bad",
            description="x",
            model="x",
            command=["train", "--data={data}"],
            parameters={"data": Parameter(type="str", default="a", many=True)},
        )
    with pytest.raises(ValidationError, match="only a str parameter"):
        Parameter(type="int", default=1, many=True)


def test_tiny_takes_nproc_for_torchrun_ranks() -> None:
    argv = TINY.argv(TINY.resolve({"nproc": "2"}), python="python3")
    assert option(argv, "--processes") == ["2"]
    assert option(TINY.argv(TINY.resolve({}), python="python3"), "--processes") == ["1"]
    with pytest.raises(ReasonError, match="above the maximum 8"):
        TINY.resolve({"nproc": "9"})
    assert TINY.argv(TINY.resolve({}), python="python3")[-4:] == ["--tuner", "lora", "--sharded", "false"]


def test_tiny_takes_a_sharded_full_fine_tune_and_refuses_a_sharded_adapter() -> None:
    argv = TINY.argv(TINY.resolve({"tuner": "full", "sharded": "true", "nproc": "2"}), python="python3")
    assert (option(argv, "--tuner"), option(argv, "--sharded")) == (["full"], ["true"])
    with pytest.raises(ReasonError, match=r"^sharded=true needs tuner=full$"):
        TINY.resolve({"sharded": "true"})
    with pytest.raises(ReasonError, match="sharded=true needs tuner=full"):  # a stored job's values, re-checked
        TINY.resolve_values({"tuner": "lora", "sharded": True})
    with pytest.raises(ReasonError, match="tuner must be one of lora, full"):
        TINY.resolve({"tuner": "qlora"})
    with pytest.raises(ReasonError, match="tuner may not start with '-'"):
        TINY.resolve({"tuner": "--lora_rank"})
    with pytest.raises(ReasonError, match="sharded must be a bool"):
        TINY.resolve({"sharded": "--push_to_hub"})


def test_a_needs_rule_names_a_declared_parameter_and_one_of_its_values() -> None:
    def recipe(needs: dict[str, str | int | float | bool]) -> Recipe:
        return Recipe(
            name="bad",
            description="x",
            model="x",
            command=["train", "{a}", "{b}"],
            parameters={
                "a": Parameter(type="bool", default=False, needs=needs),
                "b": Parameter(type="str", default="x", choices=["x", "y"]),
            },
        )

    assert recipe({"b": "y"}).resolve({"a": "true", "b": "y"}) == {"a": True, "b": "y"}
    with pytest.raises(ValidationError, match="a needs c, which the recipe does not declare"):
        recipe({"c": "y"})
    with pytest.raises(ValidationError, match="b must be one of x, y"):
        recipe({"b": "z"})


PARSE_WITH_SWIFT = """
import json, sys
from swift.arguments import SftArguments
from transformers import HfArgumentParser
plain = (str, int, float, bool, list, type(None))
parsed = []
for argv in json.loads(sys.argv[1]):
    namespace, rest = HfArgumentParser([SftArguments]).parse_known_args(argv)
    parsed.append({"rest": rest, "args": {k: v for k, v in vars(namespace).items() if isinstance(v, plain)}})
print(json.dumps(parsed))
"""


def readme_recipes() -> list[Recipe]:
    """The recipes of the configuration example (docs/bot.md), as the bot's config would load them."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "bot.md").read_text()
    [block] = [part.split("```", 1)[0] for part in text.split("```yaml\n")[1:] if "name: qwen-lora" in part]
    return [Recipe.model_validate(item) for item in yaml.safe_load(block)["recipes"]]


def test_the_pinned_ms_swift_accepts_every_flag_of_the_swift_recipes() -> None:
    """The built-in deepseek-7b and docs/bot.md's qwen-lora example, rendered as the runner runs them."""
    [qwen] = readme_recipes()
    rendered = [
        expand_argv(recipe.argv(recipe.resolve({}), python="python"), RUNNER_VALUES) for recipe in (DEEPSEEK_7B, qwen)
    ]
    assert all(argv[:3] == ["/opt/finetune/bin/python", "-m", "swift.cli.sft"] for argv in rendered)
    done = subprocess.run(
        [sys.executable, "-c", PARSE_WITH_SWIFT, json.dumps([argv[3:] for argv in rendered])],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    deepseek, readme = json.loads(done.stdout.splitlines()[-1])
    # ms-swift 4.x refuses what it does not know (as it refused --train_type): nothing is left over.
    assert deepseek["rest"] == [] and readme["rest"] == []
    assert readme["args"]["add_version"] is False and readme["args"]["callbacks"] == ["spot_checkpoint"]
    assert readme["args"]["external_plugins"] == [RUNNER_VALUES["FINETUNE_SWIFT_PLUGIN"]]
    args = deepseek["args"]
    assert args["tuner_type"] == "lora" and args["add_version"] is False
    assert args["resume_from_checkpoint"] == "/w/output/checkpoint-40" and args["output_dir"] == "/w/output"
    assert args["external_plugins"] == [RUNNER_VALUES["FINETUNE_SWIFT_PLUGIN"]]
    assert args["callbacks"] == ["spot_checkpoint"] and args["dataloader_persistent_workers"] is False
    assert len(args["dataset"]) == 3


@pytest.mark.parametrize(
    "model",
    ["/mnt/oss-data/DeepSeek-R1-Distill-Qwen-7B", "/mnt/oss-data/./x", "deepseek-ai/DeepSeek-V3", "Qwen/Qwen2-7B"],
)
def test_deepseek_takes_the_guides_paths_and_the_deepseek_and_qwen_hub_ids(model: str) -> None:
    argv = DEEPSEEK_7B.argv(DEEPSEEK_7B.resolve({"model": model}), python="python3")
    assert option(argv, "--model") == [model]


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("model", "someone/DeepSeek-R1-Distill-Qwen-7B"),  # a hub id of anyone else: their code would run
        ("model", "/root/model"),
        ("model", "/mnt/oss-data-other/model"),  # a sibling of the root, not under it
        ("model", "/mnt/oss-data"),  # the root itself is no model
        ("model", "deepseek-ai"),
        ("model", "./deepseek-ai/x"),
        ("dataset", "AI-ModelScope/alpaca-gpt4-data-zh#500,someone/data#5"),  # one entry out of bounds is enough
        ("dataset", "/tmp/data.jsonl"),
    ],
)
def test_deepseek_refuses_models_and_data_sets_outside_what_it_allows(name: str, raw: str) -> None:
    with pytest.raises(ReasonError) as refused:
        DEEPSEEK_7B.resolve({name: raw})
    assert refused.value.reason.key == "recipe.not-allowed"
    assert "it may be: /mnt/oss-data/…" in str(refused.value)


@pytest.mark.parametrize("raw", ["/mnt/oss-data/../../etc/shadow", "/mnt/oss-data/x/../../../root", "Qwen/../evil/x"])
def test_a_path_that_climbs_out_of_its_root_is_refused_and_never_matches(raw: str) -> None:
    with pytest.raises(ReasonError):
        DEEPSEEK_7B.resolve({"model": raw})
    # Matching alone, whatever the other checks do: the normalised path is outside every allowed form.
    assert not DEEPSEEK_7B.parameters["model"].allows(raw)


def test_an_allow_list_is_text_only_and_holds_its_default() -> None:
    with pytest.raises(ValidationError, match="allow"):
        Parameter(type="int", default=1, allow=["1"])
    with pytest.raises(ValidationError, match="allow"):
        Parameter(type="str", default="a", choices=["a"], allow=["a"])
    with pytest.raises(ValidationError, match="not in allow"):
        Parameter(type="str", default="x/y", allow=["/mnt/oss-data/"])
    exact = Parameter(type="str", default="tiny-llama", allow=["tiny-llama", "/data/"])
    assert exact.parse("model", "/data/a") == "/data/a"
    with pytest.raises(ReasonError, match="it may be: tiny-llama, /data/…"):
        exact.parse("model", "tiny-llama-2")


@pytest.mark.parametrize(
    "overrides",
    [
        {"trust_remote_code": "true"},
        {"model": "--trust_remote_code"},
        {"model": "Qwen/x,--trust_remote_code"},
        {"dataset": "swift/self-cognition#5,--trust_remote_code=true"},
        {"model": "Qwen/x --trust_remote_code true"},
    ],
)
def test_no_override_turns_on_remote_code(overrides: dict[str, str]) -> None:
    for recipe in (DEEPSEEK_7B, TINY, *readme_recipes()):
        with pytest.raises(ReasonError):
            recipe.resolve(overrides)


def test_no_recipe_argv_or_environment_enables_remote_code() -> None:
    """ms-swift trusts a model's code by itself (4.6 has no switch): the allow lists decide whose code that may
    be, and nothing in a recipe adds a way to trust more."""
    for recipe in (DEEPSEEK_7B, TINY, *readme_recipes()):
        values = recipe.resolve({})
        words = " ".join([*recipe.argv(values, python="python"), *recipe.env, *recipe.env.values()]).lower()
        assert "remote_code" not in words and "remote-code" not in words
        assert all(spec.choices or spec.allow for spec in recipe.parameters.values() if spec.type == "str")
