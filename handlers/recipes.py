"""Recipes: named, validated fine-tunes, and the typed overrides a chat user may give them.

A chat argument never reaches a shell. ``key=value`` overrides are checked against the recipe's declared
parameters (type, bounds, choices) and only then substituted into the recipe's argv template, one argv item
at a time, so a value can never become a second argument, let alone a command. Text never starts with ``-``
(the trainer would read it as a flag) and never holds a ``..`` path part. A ``many`` parameter takes a
comma-separated list (``dataset=a#500,b#500``), each entry checked alone, and fills an argv item that is exactly
its placeholder with one item per entry: the trainer's own list option, never a new flag.

A parameter that names code or data the trainer loads (a model, a data set) lists what it may be (``allow``):
exact values, and prefixes ending in ``/`` (a hub organisation such as ``Qwen/``, a path root such as
``/mnt/oss-data/``). A value is matched in its normalised form, so ``/mnt/oss-data/./x`` is under the root and
``/mnt/oss-data/../../etc`` never is. Nothing a chat user types turns on remote code: no parameter maps to a flag
such as ``--trust_remote_code`` and no value can become one; which models and data sets may bring their own code
(ms-swift trusts every model's code) is decided by ``allow``, which only the recipe's author sets.
"""

from __future__ import annotations

import math
import posixpath
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from handlers.errors import ReasonError
from handlers.job_options import MAX_NODES
from handlers.reasons import Wording
from handlers.spec import HangRule

ParamValue = str | int | float | bool
_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_SAFE_TEXT = re.compile(r"^[A-Za-z0-9._:/@+#-]{1,200}$")
# The first character of a value from chat: never one a trainer's argument parser could take for an option
# ("-", "--push_to_hub"), an argument file (argparse's "@file") or another option prefix ("+"). The value stays
# one argv item either way; this keeps it from being read as anything but a value.
_SAFE_FIRST = re.compile(r"^[A-Za-z0-9._/]")


WORDING = Wording(
    {
        "recipe.unknown": "unknown recipe {name!r}; known recipes: {known}",
        "recipe.no-parameter": "{recipe} has no parameter {name!r} (it takes: {allowed})",
        "recipe.no-parameters": "{recipe} has no parameter {name!r} (it takes: none)",
        "recipe.parameter-gone": "{recipe} no longer has a parameter {name!r}",
        "recipe.not-int": "{name} must be an int, not {raw!r}",
        "recipe.not-float": "{name} must be a float, not {raw!r}",
        "recipe.not-bool": "{name} must be a bool, not {raw!r}",
        "recipe.not-str": "{name} must be a str, not {raw!r}",
        "recipe.below-minimum": "{name}={value} is below the minimum {minimum}",
        "recipe.above-maximum": "{name}={value} is above the maximum {maximum}",
        "recipe.not-a-choice": "{name} must be one of {choices}",
        "recipe.unsafe-text": "{name} may only use letters, digits and . _ : / @ + # -",
        "recipe.option-like": "{name} may not start with {first!r}: a trainer could read it as an option",
        "recipe.not-allowed": "{name} {value!r} is not allowed; it may be: {forms}",
        "recipe.needs": "{name}={value} needs {other}={wanted}",
    }
)


class Parameter(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["int", "float", "str", "bool"]
    default: ParamValue
    min: float | None = None
    max: float | None = None
    choices: list[str] | None = None
    many: bool = False
    allow: list[str] | None = None  # exact values, and prefixes ending in "/" (hub organisations, path roots)
    # What a value other than the default asks of the other parameters (``sharded`` needs ``tuner=full``).
    needs: dict[str, ParamValue] = Field(default_factory=dict)
    help: str = ""

    @model_validator(mode="after")
    def _many_is_text(self) -> Parameter:
        if self.many and self.type != "str":
            raise ValueError("only a str parameter can take many values")
        if self.allow is not None and (self.type != "str" or self.choices is not None or not self.allow):
            raise ValueError("allow: a non-empty list, for a str parameter without choices")
        if isinstance(self.default, str) and not all(self.allows(item) for item in self.items(self.default)):
            raise ValueError(f"the default {self.default!r} is not in allow")
        return self

    def allows(self, item: str) -> bool:
        """Whether one entry is an allowed value or lies under an allowed prefix, once normalised."""
        if self.allow is None:
            return True
        normal = posixpath.normpath(item)
        if not item.startswith("/") and normal != item:  # "./Qwen/x" is a local path, not the hub id "Qwen/x"
            return False
        return any(normal.startswith(form) if form.endswith("/") else normal == form for form in self.allow)

    def allowed_forms(self) -> str:
        """The allowed values and prefixes as a person reads them: ``/mnt/oss-data/…, Qwen/…``."""
        return ", ".join(form + "…" if form.endswith("/") else form for form in self.allow or [])

    def parse(self, name: str, raw: str) -> ParamValue:
        """The typed value of ``raw``, or ReasonError (``recipe.*``) saying what is allowed."""
        value: ParamValue
        try:
            if self.type == "int":
                value = int(raw)
            elif self.type == "float":
                value = float(raw)
                if not math.isfinite(value):
                    raise ValueError(raw)
            elif self.type == "bool":
                lowered = raw.lower()
                if lowered not in ("true", "false", "yes", "no", "1", "0"):
                    raise ValueError(raw)
                value = lowered in ("true", "yes", "1")
            else:
                value = raw
        except ValueError:
            raise ReasonError(WORDING(f"recipe.not-{self.type}", name=name, raw=raw)) from None
        if raw[:1] and not _SAFE_FIRST.match(raw):  # a negative number too: "-1e-05" looks like an option
            raise ReasonError(WORDING("recipe.option-like", name=name, first=raw[0]))
        self.check(name, value)
        return value

    def check(self, name: str, value: ParamValue) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if self.min is not None and value < self.min:
                raise ReasonError(WORDING("recipe.below-minimum", name=name, value=value, minimum=_num(self.min)))
            if self.max is not None and value > self.max:
                raise ReasonError(WORDING("recipe.above-maximum", name=name, value=value, maximum=_num(self.max)))
        if isinstance(value, str):
            for item in self.items(value):
                if self.choices is not None and item not in self.choices:
                    raise ReasonError(WORDING("recipe.not-a-choice", name=name, choices=", ".join(self.choices)))
                if self.choices is None and (not _SAFE_TEXT.match(item) or ".." in item.split("/")):
                    raise ReasonError(WORDING("recipe.unsafe-text", name=name))
                if self.choices is None and not _SAFE_FIRST.match(item):
                    raise ReasonError(WORDING("recipe.option-like", name=name, first=item[0]))
            for item in self.items(value):  # only once every entry is well formed: what it is, then where
                if not self.allows(item):
                    raise ReasonError(WORDING("recipe.not-allowed", name=name, value=item, forms=self.allowed_forms()))

    def items(self, value: str) -> list[str]:
        """The entries of a value: the comma-separated list of a ``many`` parameter, else the value itself."""
        return value.split(",") if self.many else [value]


class Recipe(BaseModel):
    """What to train and how; the argv ``command`` may use ``{python}`` and ``{<parameter>}`` placeholders."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,40}$")
    description: str
    model: str
    command: list[str] = Field(min_length=1)
    parameters: dict[str, Parameter] = Field(default_factory=dict)
    total_steps_param: str | None = None
    instance_types: dict[str, list[str]] = Field(default_factory=dict)
    # The most nodes a member's job of this recipe may have (``nodes=``); an admin lifts it per team (handlers/caps).
    max_nodes: int = Field(default=1, ge=1, le=MAX_NODES)
    env: dict[str, str] = Field(default_factory=dict)
    # The runner's hang watchdog: no step for max(floor_seconds, factor × the step time) is a hang (runner/hang_watch).
    hang: HangRule = Field(default_factory=HangRule)

    @model_validator(mode="after")
    def _placeholders_declared(self) -> Recipe:
        for arg in self.command:
            for name in _PLACEHOLDER.findall(arg):
                if name != "python" and name not in self.parameters:
                    raise ValueError(f"command uses {{{name}}} but the recipe declares no such parameter")
                if name != "python" and self.parameters[name].many and arg != "{" + name + "}":
                    raise ValueError(f"{{{name}}} takes many values: it must be a whole argv item")
        for name, spec in self.parameters.items():
            for other, wanted in spec.needs.items():
                if other not in self.parameters:
                    raise ValueError(f"{name} needs {other}, which the recipe does not declare")
                self.parameters[other].check(other, wanted)
        return self

    def _check_needs(self, values: dict[str, ParamValue]) -> dict[str, ParamValue]:
        """ReasonError (``recipe.needs``) when a value asks of another parameter what it was not given."""
        for name, spec in self.parameters.items():
            if values[name] == spec.default:
                continue
            for other, wanted in spec.needs.items():
                if values[other] != wanted:
                    raise ReasonError(
                        WORDING("recipe.needs", name=name, value=_text(values[name]), other=other, wanted=_text(wanted))
                    )
        return values

    def resolve(self, overrides: dict[str, str]) -> dict[str, ParamValue]:
        """Defaults with the user's overrides applied; ReasonError (``recipe.*``) for unknown or out-of-range ones."""
        values = {name: spec.default for name, spec in self.parameters.items()}
        for name, raw in overrides.items():
            spec = self.parameters.get(name)
            if spec is None:
                if not self.parameters:
                    raise ReasonError(WORDING("recipe.no-parameters", recipe=self.name, name=name))
                allowed = ", ".join(sorted(self.parameters))
                raise ReasonError(WORDING("recipe.no-parameter", recipe=self.name, name=name, allowed=allowed))
            values[name] = spec.parse(name, raw)
        return self._check_needs(values)

    def resolve_values(self, stored: dict[str, ParamValue]) -> dict[str, ParamValue]:
        """Re-check values kept with a job (they were validated at start; the recipe may have changed since)."""
        values = {name: spec.default for name, spec in self.parameters.items()}
        for name, value in stored.items():
            spec = self.parameters.get(name)
            if spec is None:
                raise ReasonError(WORDING("recipe.parameter-gone", recipe=self.name, name=name))
            spec.check(name, value)
            values[name] = value
        return self._check_needs(values)

    def total_steps(self, values: dict[str, ParamValue]) -> int | None:
        """How many steps a job with these values trains, when the recipe says which parameter tells."""
        value = values.get(self.total_steps_param) if self.total_steps_param else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def argv(self, values: dict[str, ParamValue], python: str) -> list[str]:
        """The trainer's argv: each template item formatted with already validated values (a ``many`` one
        becomes one item per entry)."""

        def fill(match: re.Match[str]) -> str:
            name = match.group(1)
            return python if name == "python" else _text(values[name])

        argv: list[str] = []
        for arg in self.command:
            whole = _PLACEHOLDER.fullmatch(arg)
            name = whole.group(1) if whole else ""
            if name in self.parameters and self.parameters[name].many:
                argv.extend(self.parameters[name].items(_text(values[name])))
            else:
                argv.append(_PLACEHOLDER.sub(fill, arg))
        return argv


def _text(value: ParamValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _num(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


TINY = Recipe(
    name="tiny",
    description="a CPU-sized Llama + LoRA that trains in seconds (demo and tests)",
    model="tiny-llama (built from a config in code)",
    command=[
        "${FINETUNE_PYTHON}",
        "-m",
        "runner.hf.tiny",
        "--max-steps",
        "{steps}",
        "--save-steps",
        "{save_steps}",
        "--lr",
        "{lr}",
        "--seed",
        "{seed}",
        "--step-seconds",
        "{step_seconds}",
        "--processes",
        "{nproc}",
        "--tuner",
        "{tuner}",
        "--sharded",
        "{sharded}",
    ],
    parameters={
        "steps": Parameter(type="int", default=30, min=1, max=10_000, help="optimizer steps"),
        "save_steps": Parameter(type="int", default=5, min=1, max=10_000, help="checkpoint interval"),
        "lr": Parameter(type="float", default=0.05, min=1e-6, max=1.0, help="peak learning rate"),
        "seed": Parameter(type="int", default=0, min=0, max=2**31 - 1),
        "step_seconds": Parameter(type="float", default=0.2, min=0.0, max=10.0, help="slow each step down"),
        "nproc": Parameter(type="int", default=1, min=1, max=8, help="data-parallel ranks (torchrun, gloo)"),
        "tuner": Parameter(type="str", default="lora", choices=["lora", "full"], help="LoRA, or every parameter"),
        "sharded": Parameter(
            type="bool",
            default=False,
            needs={"tuner": "full"},
            help="every rank saves its own shard (torch.distributed.checkpoint, FSDP2)",
        ),
    },
    total_steps_param="steps",
    instance_types={"local": ["local.cpu"], "aws": ["g5.xlarge", "g6.xlarge"], "aliyun": ["ecs.gn7i-c8g1.2xlarge"]},
    max_nodes=4,  # a small gang (the gang tests' two nodes, a stop's four), never a team's whole room
    env={"HF_HUB_OFFLINE": "1"},
)

# The Alibaba guide's `swift sft` (LoRA of DeepSeek-R1-Distill-Qwen-7B on one preemptible GPU), flag for flag in
# the ms-swift 4.x spelling, with its hyper-parameters as the defaults. What differs, and why:
# * `python -m swift.cli.sft`, not the `swift sft` wrapper: the wrapper trains in a child process and dies of a
#   SIGTERM itself (the stop file reaches the child anyway, but this way the one process is the trainer); the
#   interpreter is the runner's own (`${FINETUNE_PYTHON}`: the image installs the runner with the `swift` extra),
#   not the bot's, whose path means nothing on the GPU host;
# * `--tuner_type` (ms-swift >= 4.1 refuses `--train_type`);
# * the output, resume and plugin paths come from the runner (`${…}`), so nothing is copied onto the image;
# * `--dataloader_persistent_workers false`: with swift's default (true) a run resumed inside an epoch draws one
#   more number from the global RNG when the next epoch starts, and every dropout mask after it differs (see
#   runner/hf/callback.py); the guide's 4 workers stay;
# * `--check_model false`: no call to the model hub to ask whether a local model is the latest (a GPU host in a
#   private network waits for it to time out).
DEEPSEEK_7B = Recipe(
    name="deepseek-7b",
    description="LoRA of DeepSeek-R1-Distill-Qwen-7B with ms-swift (swift sft), as the Alibaba guide runs it",
    model="deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
    command=[
        "${FINETUNE_PYTHON}",
        "-m",
        "swift.cli.sft",
        "--model",
        "{model}",
        "--tuner_type",
        "lora",
        "--dataset",
        "{dataset}",
        "--torch_dtype",
        "{dtype}",
        "--num_train_epochs",
        "{epochs}",
        "--per_device_train_batch_size",
        "{batch_size}",
        "--per_device_eval_batch_size",
        "1",
        "--learning_rate",
        "{lr}",
        "--lora_rank",
        "{lora_rank}",
        "--lora_alpha",
        "{lora_alpha}",
        "--lora_dropout",
        "{lora_dropout}",
        "--target_modules",
        "all-linear",
        "--gradient_accumulation_steps",
        "{grad_accum}",
        "--eval_steps",
        "50",
        "--save_steps",
        "{save_steps}",
        "--save_total_limit",
        "{keep}",
        "--logging_steps",
        "5",
        "--max_length",
        "{max_length}",
        "--system",
        "You are a helpful assistant.",
        "--warmup_ratio",
        "0.05",
        "--dataloader_num_workers",
        "4",
        "--dataloader_persistent_workers",
        "false",
        "--model_author",
        "swift",
        "--model_name",
        "swift-robot",
        "--check_model",
        "false",
        "--output_dir",
        "${FINETUNE_OUTPUT_DIR}",
        "--add_version",
        "false",
        "--resume_from_checkpoint",
        "${FINETUNE_RESUME_FROM}",
        "--external_plugins",
        "${FINETUNE_SWIFT_PLUGIN}",
        "--callbacks",
        "spot_checkpoint",
    ],
    parameters={
        "model": Parameter(
            type="str",
            default="deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
            allow=["/mnt/oss-data/", "deepseek-ai/", "Qwen/"],
            help="a model hub id or an absolute path (/mnt/oss-data/DeepSeek-R1-Distill-Qwen-7B)",
        ),
        "dataset": Parameter(
            type="str",
            default="AI-ModelScope/alpaca-gpt4-data-zh#500,AI-ModelScope/alpaca-gpt4-data-en#500,swift/self-cognition#500",
            many=True,
            allow=["/mnt/oss-data/", "AI-ModelScope/", "swift/"],
            help="data set ids or paths, comma-separated; #N samples N rows",
        ),
        "dtype": Parameter(type="str", default="bfloat16", choices=["bfloat16", "float16", "float32"]),
        "epochs": Parameter(type="int", default=1, min=1, max=20),
        "batch_size": Parameter(type="int", default=1, min=1, max=64),
        "lr": Parameter(type="float", default=1e-4, min=1e-6, max=1e-2),
        "lora_rank": Parameter(type="int", default=8, min=1, max=256),
        "lora_alpha": Parameter(type="int", default=32, min=1, max=512),
        "lora_dropout": Parameter(type="float", default=0.05, min=0.0, max=0.5),
        "grad_accum": Parameter(type="int", default=16, min=1, max=256),
        "save_steps": Parameter(type="int", default=10, min=1, max=100_000, help="checkpoint interval"),
        "keep": Parameter(type="int", default=5, min=1, max=50, help="checkpoints kept on the instance"),
        "max_length": Parameter(type="int", default=2048, min=128, max=32_768),
    },
    instance_types={
        "aws": ["g5.2xlarge", "g6.2xlarge", "g5.4xlarge"],
        "aliyun": ["ecs.gn7i-c16g1.4xlarge", "ecs.gn6i-c8g1.2xlarge"],
    },
)

BUILT_IN = {recipe.name: recipe for recipe in (TINY, DEEPSEEK_7B)}


def find_recipe(name: str, recipes: dict[str, Recipe]) -> Recipe:
    recipe = recipes.get(name)
    if recipe is None:
        raise ReasonError(WORDING("recipe.unknown", name=name, known=", ".join(sorted(recipes))))
    return recipe
