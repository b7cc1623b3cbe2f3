"""The job spec: what the bot hands the runner on a GPU host (JSON on the wire, versioned).

The bot writes it (to S3 / OSS or user-data) and the runner reads it, so both import this one definition.
Validation is strict: a spec with an unknown field, a shell string for a command or a malformed URI is
refused with an error naming the field, and the runner starts nothing.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal
from urllib.parse import urlparse

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from handlers.ids import JOB_ID_PATTERN, new_key_salt

SPEC_VERSION = 1
# The runner's environment, written by the boot script (bot/cloud/user_data.py), read by its systemd unit: on Alibaba
# it holds the attempt's report key, so it is root's alone (``runner.own_paths`` checks it before a trainer starts).
RUNNER_ENV_FILE = "/etc/finetune-runner.env"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SNS_ARN = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
ATTEMPT_KEYS_PREFIX = "attempt-keys/"  # outside jobs/: no storage session reaches a key, an instance only its own
# s3://<bucket>/attempt-keys/<runner role's unique id>: (an IAM role id is AROA and upper-case letters and digits)
REPORT_KEY_PREFIX_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/attempt-keys/AROA[0-9A-Z]{4,124}:$"
# Variables the runner owns: a spec may not point the trainer elsewhere.
RESERVED_ENV = frozenset(
    {
        "FINETUNE_OUTPUT_DIR",
        "FINETUNE_RESUME_FROM",
        "FINETUNE_PROGRESS_FILE",
        "FINETUNE_STOP_FILE",
        "FINETUNE_SWIFT_PLUGIN",
        "FINETUNE_PYTHON",
        "FINETUNE_COLLECTIVE_TIMEOUT_SECONDS",
    }
)
# What the runner sets for a gang's trainer (torchrun's and ms-swift's names): the spec's gang, never its env.
GANG_ENV = frozenset({"NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"})
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")


def check_checkpoint_uri(uri: str) -> str:
    """Accept ``s3://bucket/prefix/``, ``oss://bucket/prefix/`` or ``file:///abs/path/``; end it with ``/``."""
    parsed = urlparse(uri)
    if parsed.scheme in ("s3", "oss"):
        if not _BUCKET.fullmatch(parsed.netloc):
            raise ValueError(f"{uri!r} has no valid bucket name")
        if parsed.query or parsed.fragment:
            raise ValueError(f"{uri!r} must not carry a query or fragment")
    elif parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise ValueError(f"{uri!r} must be an absolute file:/// URI")
    else:
        raise ValueError(f"{uri!r} must start with s3://, oss:// or file:///")
    if ".." in parsed.path.split("/"):
        raise ValueError(f"{uri!r} must not contain '..'")
    return uri if uri.endswith("/") else uri + "/"


def check_report_target(target: str) -> str:
    """Accept ``file:///path.jsonl``, ``sns:<topic arn>`` or ``http(s)://host/path``."""
    if target.startswith("sns:"):
        if not _SNS_ARN.fullmatch(target[4:]):
            raise ValueError(f"{target!r} is not sns:<topic ARN>")
        return target
    parsed = urlparse(target)
    if parsed.scheme == "file" and parsed.path.startswith("/") and parsed.netloc in ("", "localhost"):
        return target
    if parsed.scheme in ("http", "https") and parsed.hostname:
        return target
    raise ValueError(f"{target!r} must be file:///….jsonl, sns:<topic ARN> or http(s)://…")


class ReleaseAwsInstance(BaseModel):
    """On completion, terminate this EC2 instance (its id comes from instance metadata)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["aws-instance"]


class ReleaseAwsAutoScaling(BaseModel):
    """On completion, set the job's Auto Scaling group to desired capacity 0 so it launches no replacement."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["aws-autoscaling"]
    group: str = Field(min_length=1, max_length=255)


Release = Annotated[ReleaseAwsInstance | ReleaseAwsAutoScaling, Field(discriminator="type")]


def check_master_addr(value: str) -> str:
    """An IP address or a host name: where the gang's world meets, without a scheme or a port."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not _HOSTNAME.fullmatch(value) or value.replace(".", "").isdigit():
        raise ValueError(f"{value!r} is neither an IP address nor a host name (no scheme, no port)")
    return value


class Gang(BaseModel):
    """This node's place in a multi-node job: one torch.distributed world of ``nodes`` nodes per ``generation``.

    The world is static per generation (``MASTER_ADDR``/``MASTER_PORT``, not a c10d rendezvous): torchrun and
    ms-swift take it as it is, and the bot decides who is in it, generation by generation (an elastic rendezvous
    would add nothing: torch's elastic agent restarts every worker on a change anyway).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    nodes: int = Field(ge=2, le=64)
    node_rank: int = Field(ge=0)
    generation: int = Field(ge=1)
    master_addr: str = Field(min_length=1, max_length=253)
    master_port: int = Field(ge=1024, le=65535)

    @field_validator("master_addr")
    @classmethod
    def _master_addr(cls, value: str) -> str:
        return check_master_addr(value)

    @model_validator(mode="after")
    def _rank_in_world(self) -> Gang:
        if self.node_rank >= self.nodes:
            raise ValueError(f"node_rank {self.node_rank} is not below nodes {self.nodes}")
        return self


class HangRule(BaseModel):
    """When the runner's watchdog calls a trainer hung: no step for ``max(floor_seconds, factor × its measured step
    time)`` (never before its first step, never while a save it writes is moving). A recipe setting: the floor keeps
    a slow first stretch (compilation, a long save's stall) from being taken for a hang, the factor scales with the
    job (a 7B step of seconds is acted on in minutes, not after the bot's silent-job alarm)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    floor_seconds: float = Field(default=120.0, ge=1.0, le=86_400)  # no step for less than this is never a hang
    factor: float = Field(default=10.0, ge=2.0, le=1_000)  # × the measured step time: no step for longer is a hang

    def limit(self, step_seconds: float | None) -> float:
        """How long without a step is a hang, given the trainer's step time (None: not measured yet)."""
        return max(self.floor_seconds, self.factor * step_seconds if step_seconds else 0.0)


class JobSpec(BaseModel):
    """One attempt of one job, as the runner on the instance sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1]
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    attempt: int = Field(ge=1, le=10_000)
    command: list[str] = Field(min_length=1, max_length=512)
    env: dict[str, str] = Field(default_factory=dict)
    checkpoint_uri: str
    report: list[str] = Field(default_factory=list, max_length=8)
    notice: Literal["aws", "aliyun", "none"] = "none"
    keep_checkpoints: int = Field(default=3, ge=1, le=100)
    max_restarts: int = Field(default=2, ge=0, le=20)
    release: Release | None = None
    # AWS: where the attempt's report key lies (not the key: without a runner storage role every runner may read every
    # spec; with one, no runner reads another job's, but a spec is still no place for a secret). The runner appends its
    # instance id (from IMDS) to this prefix, s3://<bucket>/attempt-keys/<runner role id>:, and reads its own key
    # object, which the runner role lets only that instance read (runner/reports/key_object.py). Elsewhere the key
    # comes in FINETUNE_REPORT_SECRET. Never the bot's master secret.
    report_key_from: str | None = Field(default=None, pattern=REPORT_KEY_PREFIX_PATTERN)
    # The attempt's key salt (its record's, handlers/jobs.py): what the cloud derives the attempt's key from. No secret
    # (the key needs the bot's master too); the runner has no use for it.
    key_salt: str = Field(default_factory=new_key_salt, pattern=r"^[0-9a-f]{32}$")
    gang: Gang | None = None  # a multi-node job: this node's rank, the world's size and where it meets
    # A switch of market launched ahead (make-before-break): the job's previous attempt still trains until this
    # runner stands by, then commits; this one restores only once its control object says go.
    handover: bool = False
    hang: HangRule = Field(default_factory=HangRule)  # the hang watchdog's limits (runner/hang_watch.py)

    @model_validator(mode="after")
    def _gang_env_is_the_runners(self) -> JobSpec:
        if self.gang is not None:
            named = sorted(GANG_ENV & set(self.env))
            if named:
                raise ValueError(f"env sets {', '.join(named)}, which the runner sets from the spec's gang")
        return self

    @field_validator("command", mode="before")
    @classmethod
    def _argv_not_shell(cls, value: object) -> object:
        if isinstance(value, str):
            raise ValueError('must be an argv list such as ["python", "train.py"], not a shell string')
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str) and " " in value[0]:
            raise ValueError("looks like a shell string in a one-element list; split it into argv items")
        return value

    @field_validator("command")
    @classmethod
    def _no_nul(cls, value: list[str]) -> list[str]:
        if any("\x00" in arg for arg in value) or not value[0]:
            raise ValueError("argv items must be non-empty strings without NUL bytes")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, item in value.items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if name in RESERVED_ENV:
                raise ValueError(f"{name} is set by the runner itself")
            if "\x00" in item:
                raise ValueError(f"{name} contains a NUL byte")
        return value

    @field_validator("checkpoint_uri")
    @classmethod
    def _checkpoint_uri(cls, value: str) -> str:
        return check_checkpoint_uri(value)

    @field_validator("report")
    @classmethod
    def _report_targets(cls, value: list[str]) -> list[str]:
        return [check_report_target(target) for target in value]


def parse_spec(raw: str | bytes) -> JobSpec:
    """Parse and validate a spec; a ValueError (``invalid job spec: …``) whose message names each bad field."""
    try:
        return JobSpec.model_validate_json(raw)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "spec"
            problems.append(f"{where}: {error['msg']}")
        raise ValueError("invalid job spec: " + "; ".join(problems)) from None


# -- the control object: what the bot asks of a running runner, besides the spec --------------------------------
# ``<checkpoint_uri>control/attempt-<n>.json``, polled by the runner (``runner/notices/control.py``); written by
# the AWS and Alibaba providers. A state, not a message: writing it again changes nothing.


def control_key(attempt: int) -> str:
    """The control object's key, relative to the job's checkpoint prefix."""
    return f"control/attempt-{attempt}.json"


def node_control_key(attempt: int, generation: int, node_rank: int) -> str:
    """One gang node's own control object in one generation (a regroup, or a drill of that node alone).

    Per generation and rank, because a regroup carries each node's next rank and ranks change between
    generations: a key of an earlier generation is never read again, so nothing stale acts on a node.
    """
    return f"control/attempt-{attempt}/generation-{generation}/node-{node_rank}.json"


class StopControl(BaseModel):
    """Checkpoint, commit, release the capacity, exit."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["stop"] = "stop"


class InterruptTestControl(BaseModel):
    """Behave exactly as on a spot notice that reclaims the instance at ``deadline`` (clouds without FIS)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["interrupt-test"] = "interrupt-test"
    deadline: AwareDatetime


class RegroupControl(BaseModel):
    """To a gang node standing by: restore the newest complete checkpoint and train in the next generation's world
    (``gang``: this node's rank in it, the world's size and where it meets)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["regroup"] = "regroup"
    gang: Gang


class GoControl(BaseModel):
    """To a runner launched ahead of a switch of market (``JobSpec.handover``): the previous attempt's checkpoint is
    committed (or its instance is gone); restore the newest complete checkpoint and train."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["go"] = "go"


class SaveControl(BaseModel):
    """Save a checkpoint now and commit it, training on (an early signal only the bot heard: an Alibaba scheduled
    system event). ``at``: the signal's time; a new one is a new request."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["save"] = "save"
    at: AwareDatetime


AnyControl = StopControl | InterruptTestControl | RegroupControl | GoControl | SaveControl
ControlRequest = Annotated[AnyControl, Field(discriminator="type")]
_CONTROL: TypeAdapter[AnyControl] = TypeAdapter(ControlRequest)


def dump_control(request: AnyControl) -> bytes:
    return request.model_dump_json().encode()


def parse_control(raw: bytes | str) -> AnyControl:
    """The control object; ``ValueError`` (pydantic's, naming the field) when it is malformed or unknown."""
    return _CONTROL.validate_json(raw)
