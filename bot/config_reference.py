"""The configuration reference (``docs/configuration.md``), rendered from the settings models so it cannot drift.

Every environment variable of :class:`bot.settings.Settings` and every key of the config file
(:class:`bot.settings.FileConfig`, section by section) comes from the models themselves: name, type, bounds,
default, and the comment the code carries beside the field (a trailing one, else the block above the run of fields
it heads). The variables read outside the settings model (the runner's, the clouds' SDKs') are found in the
source of ``bot``, ``handlers`` and ``runner`` (read as text: nothing of the runner is imported) and described in
:data:`OTHER_VARIABLES`; rendering fails on one found and not described, or described and no longer read.

``python -m bot.config_reference`` prints the page; ``--write`` writes it. ``tests/test_docs.py`` renders it
again and fails while the committed page differs.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import re
import sys
import tokenize
import types
from functools import cache
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from bot.config_keys import alternatives
from bot.settings import FileConfig, Settings

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "configuration.md"
SCANNED = ("bot", "handlers", "runner")
VARIABLE = re.compile(r"^(FINETUNE|SLACK|DINGTALK|PAGERDUTY|OPSGENIE|REDIS|AWS|ALIBABA_CLOUD|OSS)_[A-Z0-9_]*[A-Z0-9]$")

# Who reads each variable that the settings model does not hold, and what it does. Keep it in step with the code:
# rendering refuses a variable read and not here, and one here and read nowhere.
Reader = Literal["bot", "runner", "trainer"]
OTHER_VARIABLES: dict[str, tuple[Reader, str]] = {
    "FINETUNE_LOG_LEVEL": (
        "bot",
        "log level (`DEBUG` … `CRITICAL`); default `INFO` for `serve` and `chat`, else `WARNING`; "
        "the runner's too (default `INFO`)",
    ),
    "AWS_REGION": (
        "bot",
        "the AWS region when `aws.region` is not set; the runner's S3 client's when `FINETUNE_STORAGE_REGION` is not",
    ),
    "AWS_DEFAULT_REGION": ("bot", "the AWS region when neither `aws.region` nor `AWS_REGION` is set"),
    "ALIBABA_CLOUD_ACCESS_KEY_ID": (
        "bot",
        "an Alibaba key pair: refused by the bot unless `aliyun.allow_static_keys` "
        "(a local test) or with `ALIBABA_CLOUD_SECURITY_TOKEN` (STS); the runner's "
        "`oss://` store signs with it when set",
    ),
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET": ("bot", "the secret of that key pair"),
    "ALIBABA_CLOUD_SECURITY_TOKEN": ("bot", "the STS token that makes the key pair short-lived"),
    "ALIBABA_CLOUD_ECS_METADATA": (
        "runner",
        "the instance RAM role whose STS credentials the `oss://` store uses "
        "when no key pair is set (the bot hands it to Alibaba runners)",
    ),
    "ALIBABA_CLOUD_METADATA_ENDPOINT": (
        "runner",
        "the ECS metadata service (notices, the RAM role's credentials); "
        "default `http://100.100.100.200`; the local cloud points it at its "
        "stand-in",
    ),
    "AWS_EC2_METADATA_SERVICE_ENDPOINT": (
        "runner",
        "the IMDSv2 endpoint the notices are polled on; default "
        "`http://169.254.169.254`; the local cloud points it at its stand-in",
    ),
    "AWS_ENDPOINT_URL": ("runner", "the S3 endpoint of `s3://` stores (botocore's own setting)"),
    "AWS_MAX_ATTEMPTS": ("runner", "tries per storage request, botocore's retries included (default 5)"),
    "OSS_ENDPOINT": (
        "runner",
        "the OSS endpoint of `oss://` stores, e.g. `https://oss-cn-hangzhou-internal.aliyuncs.com`",
    ),
    "OSS_REGION": ("runner", "the OSS region, when the endpoint's name does not say it"),
    "FINETUNE_SPEC": (
        "runner",
        "the attempt's spec URI; the runner unit passes it as `--spec` (the user data sets it)",
    ),
    "FINETUNE_KEY_FROM": ("runner", "where the attempt's key objects lie (AWS): the runner appends its instance id"),
    "FINETUNE_WORK_DIR": (
        "runner",
        "local scratch space of the attempt (default a directory under the system's temporary one)",
    ),
    "FINETUNE_REPORT_SECRET": (
        "runner",
        "on the local cloud and Alibaba: the attempt's report key (never the bot's master secret)",
    ),
    "FINETUNE_STOP_GRACE_SECONDS": (
        "runner",
        "the deadline of a SIGTERM to the runner itself (systemctl stop); default 90",
    ),
    "FINETUNE_PROGRESS_SECONDS": ("runner", "at most one progress report per this many seconds; default 10"),
    "FINETUNE_SYNC_SECONDS": ("runner", "how often to look for a newly completed checkpoint; default 1"),
    "FINETUNE_STORAGE_PATIENCE_SECONDS": (
        "runner",
        "how long start-up and completion keep retrying storage (and wait for the key object); default 300",
    ),
    "FINETUNE_TRAINER_ECHO": ("runner", "`0` keeps the trainer's output in `trainer.log` only"),
    "FINETUNE_CONTROL_POLL_SECONDS": (
        "runner",
        "how often to look for a stop or interrupt test from the bot; default 5",
    ),
    "FINETUNE_REPORT_RESERVE_SECONDS": (
        "runner",
        "seconds before a deadline kept for the `interrupted` report; default 5% of the window, 2–5 s",
    ),
    "FINETUNE_SETTLE_SECONDS": (
        "runner",
        "a checkpoint file unchanged this long is sent before the trainer's marker; default 1",
    ),
    "FINETUNE_CREDENTIALS_CHECK_SECONDS": (
        "runner",
        "how often the attempt's storage session (AWS) is looked at; default 30",
    ),
    "FINETUNE_CREDENTIALS_WAIT_SECONDS": (
        "runner",
        "how long a finished job's output waits for a renewed storage session; default 21600 (6 h)",
    ),
    "FINETUNE_COLLECTIVE_TIMEOUT_SECONDS": (
        "runner",
        "a gang's trainer: how long a collective waits for a lost peer; default 120 (handed to the trainer)",
    ),
    "FINETUNE_GANG_WAIT_SECONDS": (
        "runner",
        "a gang node stopping: how long it waits for every node's part of its step; default 300",
    ),
    "FINETUNE_EARLY_SAVE_SECONDS": (
        "runner",
        "an early signal (rebalance, scheduled event): how long the trainer's fresh save is waited for before the "
        "newest existing checkpoint is committed instead; default 600",
    ),
    "FINETUNE_NOTICE_POLL_SECONDS": (
        "runner",
        "how often the metadata service is polled for a notice; default 0.5, never slower than 1",
    ),
    "FINETUNE_METADATA_GUARD": (
        "runner",
        "`required` (the default and the unit's): no trainer starts unless its "
        "user is kept off the metadata service; `off`: no rule (the local cloud)",
    ),
    "FINETUNE_TRAINER_USER": (
        "runner",
        "the user a root runner starts the trainer as; default `finetune-train`; "
        "`root` keeps it as root (a development host)",
    ),
    "FINETUNE_TRAINER_ENV": (
        "runner",
        "further variables of the runner's own to hand the trainer, comma-separated (e.g. `HF_TOKEN,HF_HOME`)",
    ),
    "FINETUNE_TRAINER_PYTHONPATH": ("runner", "put on the trainer's `PYTHONPATH` after the runner's package"),
    "FINETUNE_S3_PART_MIB": ("runner", "the part size of S3 / OSS transfers in MiB; default 16"),
    "FINETUNE_S3_CONCURRENCY": (
        "runner",
        "parts in flight at once, and the most send lanes (threads) they go out on; default 8",
    ),
    "FINETUNE_S3_ADDRESSING": (
        "runner",
        "`auto`, `virtual` or `path`: how buckets are addressed (default: "
        "botocore's for `s3://`, `virtual` for `oss://`)",
    ),
    "FINETUNE_STORAGE_REGION": (
        "runner",
        "the `s3://` bucket's region, which the runner signs for and reaches wherever its instance runs (the bot "
        "sets the home region `aws.region`); default `AWS_REGION`",
    ),
    "FINETUNE_OUTPUT_DIR": ("trainer", "where the trainer writes `checkpoint-<step>/` and its final output"),
    "FINETUNE_RESUME_FROM": ("trainer", "the restored checkpoint to resume from, or empty"),
    "FINETUNE_PROGRESS_FILE": ("trainer", "where the trainer's callback writes its step and loss"),
    "FINETUNE_STOP_FILE": ("trainer", "created by the runner to ask for a save and a stop"),
    "FINETUNE_SWIFT_PLUGIN": ("trainer", "the ms-swift plugin in the runner's own package"),
    "FINETUNE_PYTHON": ("trainer", "the runner's own interpreter, e.g. `/opt/finetune/bin/python`"),
}

# What a field is for, where its code carries no comment (a comment in the code wins: rendering refuses a note for a
# field that has one, or for a field that does not exist, so these stay in step with the models).
FIELD_NOTES: dict[str, str] = {
    "Settings.finetune_cloud": "where jobs run: `local` (processes on this machine, the demo), `aws`, `aliyun`; the "
    "config file's section of that name says how",
    "Settings.finetune_report_secret": "the master of the runners' report keys (each attempt's key is derived from "
    "it; no runner holds it); unset: random per start. Set it in production, the same on every replica",
    "Settings.redis_url": "the shared state (`redis://`, `rediss://`, `unix://`); unset: an embedded Valkey with its "
    "append-only file under the state dir (one replica on one host)",
    "Settings.finetune_state_dir": "the embedded Valkey's data, the local cloud's files, `chat`'s log and the lock "
    "that keeps a second bot off them",
    "Settings.finetune_http_port": "the HTTP server's port (`/healthz`, `/metrics`, `/runner/reports`, "
    "`/slack/events`, `/aws/sns`, `/aliyun/*`); `chat` picks a free one unless it is set",
    "Settings.finetune_http_host": "the address it binds: loopback on a laptop, `0.0.0.0` behind a load balancer or "
    "in a container (the image, the unit and the manifests set it)",
    "Settings.finetune_config": "the YAML config file (the sections below)",
    "Settings.finetune_local_grace_seconds": "the local cloud: seconds from a spot notice to the instance's reclaim",
    "Settings.finetune_local_spot_price": "the local cloud's spot price per hour",
    "Settings.finetune_local_on_demand_price": "the local cloud's on-demand price per hour",
    "Settings.finetune_local_time_scale": (
        "wall seconds per profile second: the local cloud holds a boot this share of its profile time (unset: the "
        "profile's own)"
    ),
    "Settings.finetune_sns_topics": "topic ARNs whose HTTPS subscription `POST /aws/sns` accepts, comma-separated "
    "(instead of the queue)",
    "Settings.finetune_report_topics": "further topics runner reports count from, comma-separated (besides "
    "`aws.report_topic_arn`)",
    "Settings.slack_signing_secret": "Slack's HTTP mode: the app's signing secret (requests to `/slack/events`)",
    "Settings.slack_app_token": "Slack's Socket Mode: the app-level token (`xapp-…`, `connections:write`); no public "
    "URL needed",
    "Settings.finetune_aliyun_webhook_sources": "the networks Alibaba's pushes may come from, comma-separated CIDRs; "
    "unset: any",
    "Settings.dingtalk_client_secret": "the DingTalk app's client secret",
    "Settings.pagerduty_events_url": "PagerDuty's Events API base",
    "FileConfig.policy": "who may do what, the caps, retention, the lifecycle and the spot policy",
    "FileConfig.recipes": "recipes added to the built-in `tiny` and `deepseek-7b`",
    "PolicyConfig.teams": "team name → its members, channels and cap overrides",
    "PolicyConfig.rate": "per-user rate limits",
    "Team.members": "`platform:id` of each member: they may act on the team's jobs",
    "Team.channels": "`platform:id` of each channel whose jobs are the team's (a channel is one team's at most)",
    "RateLimits.commands_per_minute": "commands of any kind a user may send a minute",
    "RateLimits.starts_per_minute": "`start`s (and resumes) a user may send a minute",
    "Lifecycle.relaunch_pause_max_seconds": "the cap of that doubling pause",
    "Lifecycle.reconcile_launch_grace_seconds": "how long a launch may go unlisted by the cloud before it counts as "
    "gone",
    "Lifecycle.silent_after_seconds": "a RUNNING job unheard of this long: the channel hears so, once",
    "SpotSettings.name": "the spot policy that steers jobs started with `deadline=` or `budget=` (any other name "
    "than the default: every job)",
    "SpotSettings.tick_seconds": "how often the policy is asked again while a job it steers is active",
    "Recipe.name": "what `start <recipe>` names",
    "Recipe.description": "one line, shown by `help`",
    "Recipe.model": "the model it trains, as shown on the card",
    "Recipe.command": "the trainer's argv: `{python}`, `{<parameter>}` and the runner's `${FINETUNE_…}` values "
    "may appear; never a shell string",
    "Recipe.parameters": "parameter name → what a user may override, typed and bounded",
    "Recipe.total_steps_param": "the parameter that says how many steps a job trains (its progress bar and ETA)",
    "Recipe.instance_types": "cloud (`aws`, `aliyun`, `local`) → instance types in order of preference",
    "Recipe.env": "variables for the trainer (never the runner's own: `FINETUNE_*`, credentials)",
    "Parameter.type": "how a value is read",
    "Parameter.default": "the value when none is given",
    "Parameter.min": "the least value (numbers)",
    "Parameter.max": "the greatest value (numbers)",
    "Parameter.choices": "the only values accepted",
    "Parameter.many": "a comma-separated list of values, each one argv item",
    "Parameter.help": "what it is, shown by `help`",
    "OnCall.people": "name → the ids each platform mentions them by",
    "OnCall.shift_hours": "each rota entry's shift, counted from `rota_starts`",
    "OnCall.ladder": "the escalation steps of a page, until acknowledged",
    "OnCall.repeat_every_minutes": "then the last step again this often",
    "OnCall.max_repeats": "at most this many times",
    "LadderStep.after_minutes": "minutes after the page opened",
    "LadderStep.notify": "`primary`, `secondary`, `channel`, `here`, `pagerduty`, `opsgenie` or a person's name",
    "AwsSettings.bucket": "the checkpoint bucket (the runner stack's `CheckpointBucketName`)",
    "AwsSettings.prefix": "where jobs' specs and checkpoints go in the bucket",
    "AwsSettings.security_group_ids": "the runners' security groups (without a launch template)",
    "AwsSettings.key_name": "an EC2 key pair for the runners (none: no SSH key; Session Manager works)",
    "AwsSettings.mode": "`instances`: the bot launches each attempt; `autoscaling`: a group per job",
    "AwsSettings.group_wait_seconds": "autoscaling mode: how long a launch waits for the group's instance",
    "AwsSettings.group_poll_seconds": "autoscaling mode: how often it looks",
    "AwsSettings.fis_role_arn": "the role FIS runs interrupt tests with (the runner stack's `FisRoleArn`)",
    "AwsSettings.interrupt_test_notice": "the notice an interrupt test gives (ISO 8601, `PT2M` as EC2's own)",
    "AwsSettings.runner_path": "where the runner is installed on the image",
    "AwsSettings.work_dir": "the runner's scratch space on the instance",
    "AwsSettings.on_demand_prices": "instance type → on-demand price per hour, over the built-in list (your discounts)",
    "SlackConfig.channels": "channel id → what it does differently (its language)",
    "SlackConfig.app_id": "the app served; unset: as `auth.test` says",
    "SlackChannel.language": "the channel's language: `en` or `zh-CN`",
    "AliyunSettings.prefix": "where jobs' specs and checkpoints go in the bucket",
    "AliyunSettings.access_key_secret": "the secret of `access_key_id` (local tests only)",
    "AliyunSettings.security_group_ids": "the runners' security groups",
    "AliyunSettings.key_pair": "an ECS key pair for the runners",
    "AliyunSettings.system_disk_size": "GiB; default ECS's",
    "AliyunSettings.mode": "`instances`: the bot runs each attempt; `scaling-group`: one ESS group per job",
    "AliyunSettings.group_wait_seconds": "scaling-group mode: how long a launch waits for the group's instance",
    "AliyunSettings.group_poll_seconds": "scaling-group mode: how often it looks",
    "AliyunSettings.runner_path": "where the runner is installed on the image",
    "AliyunSettings.work_dir": "the runner's scratch space on the instance",
    "DingTalkConfig.language": "the default language of every group: `zh-CN` or `en`",
    "DingTalkConfig.channels": "group (openConversationId) → what it does differently",
    "DingTalkChannel.language": "the group's language",
    "DingTalkChannel.robot_webhook": "the custom robot (自定义机器人) alerts and pages go through",
    "DingTalkChannel.robot_secret": "its 加签 secret (`SEC…`): every call is signed",
    "RedisOptions.durability": "what a state change waits for: `none`, `replica` (`WAIT 1`) or `aof` (`WAITAOF`)",
}


def render() -> str:
    """The whole page."""
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m bot.config_reference --write` from the settings models; do not edit by hand:",
        "     tests/test_docs.py fails while this page and the code disagree. -->",
        "",
        "The bot reads environment variables and, when `FINETUNE_CONFIG` (a path) or `FINETUNE_CONFIG_YAML` (the",
        "text) is set, a YAML file. The runner and the trainer read environment variables only. A bad value is one",
        "line naming it and exit code 2. An example file is in [the bot's guide](bot.md#configuration).",
        "",
        "## The bot's environment",
        "",
        "| variable | type | default | what it does |",
        "|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        out.append(_row(f"`{name.upper()}`", field, _described(Settings, name)))
    others = _other_variables()
    for reader, title in (
        ("bot", "Other variables the bot reads"),
        ("runner", "The runner's environment"),
        ("trainer", "What the runner hands the trainer"),
    ):
        out += ["", f"## {title}", "", "| variable | what it does |", "|---|---|"]
        out += [f"| `{name}` | {_cell(text)} |" for name, (who, text) in sorted(others.items()) if who == reader]
    out += ["", "## The config file", "", "Every section is optional; a key not listed is refused.", ""]
    out += _sections(FileConfig, "")
    return "\n".join(out).rstrip() + "\n"


def _sections(model: type[BaseModel], path: str) -> list[str]:
    """A table per model, then one per model below it, each headed by its place in the file."""
    out: list[str] = []
    nested: list[tuple[type[BaseModel], str]] = []
    if path:
        out += [f"### `{path}`", ""]
        doc = inspect.getdoc(model)
        if doc and model.__doc__ is not None and "__doc__" in vars(model):
            out += [_markdown(" ".join(doc.split())), ""]
    out += ["| key | type | default | what it does |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        out.append(_row(f"`{name}`", field, _described(model, name)))
        inner = _model_in(field.annotation)
        if inner is not None:
            model_type, shape = inner
            nested.append((model_type, f"{path}.{name}".lstrip(".") + shape))
    out.append("")
    for model_type, place in nested:
        out += _sections(model_type, place)
    return out


def _model_in(annotation: Any) -> tuple[type[BaseModel], str] | None:
    """The model a field holds, directly, optionally, in a list or as a map's values, with the path's suffix."""
    for arg in _alternatives(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg, ""
        origin, args = get_origin(arg), get_args(arg)
        if origin is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            return args[0], "[]"
        if origin is dict and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
            return args[1], ".<name>"
    return None


def _alternatives(annotation: Any) -> list[Any]:
    """The types a value may have, ``None`` aside (whether it may be missing is said apart)."""
    return [arg for arg in alternatives(annotation) if arg is not type(None)]


def _row(name: str, field: FieldInfo, description: str) -> str:
    return f"| {name} | {_cell(_type(field))} | {_cell(_default(field))} | {_cell(description)} |"


def _type(field: FieldInfo) -> str:
    words = _type_name(field.annotation)
    bounds = []
    for item in field.metadata:
        for attribute, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if isinstance(item, getattr(annotated_types, attribute.capitalize())):
                bounds.append(f"{sign} {getattr(item, attribute)}")
        if isinstance(item, annotated_types.MinLen):
            bounds.append(f"at least {item.min_length}")
        if isinstance(item, annotated_types.MaxLen):
            bounds.append(f"at most {item.max_length} long")
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            bounds.append(f"matching `{pattern}`")
    return ", ".join([words, *bounds])


def _type_name(annotation: Any) -> str:
    options = _alternatives(annotation)
    optional = len(options) < len(get_args(annotation)) if get_origin(annotation) in (Union, types.UnionType) else False
    names = [_one_type(option) for option in options]
    text = " or ".join(names)
    return f"{text} (optional)" if optional else text


def _one_type(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{value}`" for value in args)
    if origin is list:
        return f"list of {_one_type(args[0])}"
    if origin is dict:
        return f"map of {_one_type(args[0])} to {_one_type(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if annotation is SecretStr:
        return "secret"
    if isinstance(annotation, type):
        return {"str": "text", "float": "number", "int": "whole number", "bool": "boolean", "Path": "path"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation).replace("typing.", "")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None or value == {} or value == [] or value == "":
        return "none"
    if isinstance(value, BaseModel):
        return "its defaults (below)"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return "; ".join(", ".join(f"{k}: {v}" for k, v in item.model_dump(mode="json").items()) for item in value)
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`"


def _cell(text: str) -> str:
    """Text for a table cell, on one line: a pipe outside code escaped (one already escaped kept); inside code the
    table reads a pipe as code already."""
    parts = _markdown(text).replace("\n", " ").split("`")
    return "`".join(re.sub(r"(?<!\\)\|", "\\|", part) if index % 2 == 0 else part for index, part in enumerate(parts))


def _markdown(text: str) -> str:
    """The code's reStructuredText spellings as Markdown: ``x`` and :mod:`x` become `x`."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text.replace("``", "`"))


def _described(model: type[BaseModel], name: str) -> str:
    """The comment beside the field where it is declared (the first class of the model's MRO that declares it),
    else its note in :data:`FIELD_NOTES`; ValueError for a field with neither, or with both."""
    for klass in model.__mro__:
        if isinstance(klass, type) and issubclass(klass, BaseModel) and name in _comments(klass):
            key = f"{klass.__name__}.{name}"
            comment, note = _comments(klass)[name], FIELD_NOTES.get(key)
            if comment and note:
                raise ValueError(f"{key} has a comment in the code now: drop its FIELD_NOTES entry")
            if comment or note:
                return comment or note or ""
    raise ValueError(f"{model.__name__}.{name} says nothing of itself: add a comment beside it in the code")


@cache
def _comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name → its comment, read from the class's source: the comment on the field's own line (and the
    lower-case comment lines that carry it on), else the comment block right above the field."""
    source = inspect.getsource(model)
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip(" -")
    alone = {number for number in comments if lines[number - 1].lstrip().startswith("#")}
    [klass] = ast.parse(source).body
    assert isinstance(klass, ast.ClassDef)
    found: dict[str, str] = {}
    taken: set[int] = set()  # comment lines that carry on the comment of the field above them
    for node in klass.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        end = node.end_lineno or node.lineno
        own = [comments[number] for number in range(node.lineno, end + 1) if number in comments]
        following = end + 1
        while own and following in alone and comments[following][:1].islower() and _unfinished(lines[end - 1], own):
            own.append(comments[following])
            taken.add(following)
            following += 1
        above: list[str] = []
        line = node.lineno - 1
        while line in alone and line not in taken:
            above.insert(0, comments[line])
            line -= 1
        found[node.target.id] = " ".join(own or above)
    return found


def _unfinished(line: str, comment: list[str]) -> bool:
    """Whether a field's trailing comment goes on below it: a parenthesis left open, or a line at the limit."""
    text = " ".join(comment)
    return text.count("(") > text.count(")") or len(line) >= 110


def _other_variables() -> dict[str, tuple[Reader, str]]:
    """:data:`OTHER_VARIABLES`, checked against the variable names the source of the three packages spells."""
    settings = {name.upper() for name in Settings.model_fields}
    spelled = {name for name in _spelled() if name not in settings or name in OTHER_VARIABLES}
    missing = sorted(spelled - set(OTHER_VARIABLES))
    stale = sorted(set(OTHER_VARIABLES) - spelled)
    problems = [f"describe {', '.join(missing)}"] if missing else []
    problems += [f"read nowhere: {', '.join(stale)}"] if stale else []
    if problems:
        raise ValueError(f"bot/config_reference.py OTHER_VARIABLES is out of step with the code: {'; '.join(problems)}")
    return OTHER_VARIABLES


def _spelled() -> set[str]:
    """Every environment variable's name spelled as a whole string in ``bot``, ``handlers`` and ``runner``."""
    names: set[str] = set()
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and VARIABLE.match(node.value):
                    names.add(node.value)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bot.config_reference", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {PAGE.relative_to(ROOT)} instead of printing")
    args = parser.parse_args(argv)
    page = render()
    if args.write:
        PAGE.write_text(page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
