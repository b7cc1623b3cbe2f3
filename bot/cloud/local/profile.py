"""The local cloud's profile of a real cloud: how long a launch takes, how fast a fresh node restores, how many nodes
a zone starts at once.

A local instance is a process that is up in under a second and restores from this machine's disk, so on its own
the local cloud shows none of the costs that decide a gang's recovery on a cloud (a replacement node against a
whole-gang restart). ``FINETUNE_LOCAL_PROFILE`` names a built-in profile (``instant``, the default; ``aws-p5``) or a
file (``.toml``, ``.json``, ``.yaml``) with the same keys; the local cloud then holds every launch for the profile's
time before the instance starts (:mod:`bot.cloud.local.profile_clock`).

``aws-p5``'s figures, and where they come from:

- ``launch_seconds`` 120 ± ``launch_spread_seconds`` 60: AWS's p5 instances take one to three minutes from
  ``RunInstances`` to a booted host with its GPU drivers and EFA up (the Deep Learning AMI's boot dominates); a gang
  waits for its slowest node (:mod:`bot.cloud.local.profile_clock`).
- ``restore_bytes_per_second`` 1.25 GB/s: 10 Gb/s, the throughput s3transfer's CRT transfer manager targets when it
  cannot tell the instance's own (public single-instance S3 benchmarks reach 1-8 GB/s with many connections).
- ``fresh_bytes`` 140 GB: what a fresh p5 node fetches before it trains besides the tiny stand-in checkpoint: the
  base weights of a 70B model in bf16. A survivor of a gang holds them already; every node of a whole-gang restart
  fetches them again.
- ``zone_capacity`` 4: p5 spot capacity in one zone is thin and AWS publishes no figure; this profile assumes a zone
  starts at most four at once, the rest as those are up.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bot.errors import ConfigError

PROFILE_VARIABLE = "FINETUNE_LOCAL_PROFILE"


class LocalProfile(BaseModel):
    """What a launch costs on the cloud the local cloud stands in for (all in the profile's seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(default="custom", pattern=r"^[A-Za-z0-9._-]{1,40}$")
    launch_seconds: float = Field(default=0.0, ge=0, le=3600)  # a launch request to the host booted (typical)
    launch_spread_seconds: float = Field(default=0.0, ge=0, le=3600)  # launches take launch_seconds ± this
    restore_bytes_per_second: float | None = Field(default=None, gt=0)  # a fresh node's fetch; None: this disk's
    fresh_bytes: int = Field(default=0, ge=0, le=10**14)  # what a fresh node fetches besides the checkpoint
    zone_capacity: int | None = Field(default=None, ge=1, le=10_000)  # nodes a zone starts at once; None: any
    # Wall seconds per profile second: 1 holds a boot as long as the profile says; 0.02 holds a four-minute boot
    # for five seconds and the profile's clock jumps the rest (tests, benches, a demo). Never 0: boots that overlap
    # on a cloud must overlap here too, and a boot held for no time at all ends before the next launch begins.
    time_scale: float = Field(default=1.0, gt=0, le=1000)

    @property
    def instant(self) -> bool:
        return self.launch_seconds + self.launch_spread_seconds + self.fetch_seconds() == 0

    def fetch_seconds(self) -> float:
        """A fresh node's fetch of what it needs besides the checkpoint, at the profile's bandwidth."""
        if self.restore_bytes_per_second is None:
            return 0.0
        return self.fresh_bytes / self.restore_bytes_per_second


INSTANT = LocalProfile(name="instant")
AWS_P5 = LocalProfile(
    name="aws-p5",
    launch_seconds=120.0,
    launch_spread_seconds=60.0,
    restore_bytes_per_second=1.25e9,
    fresh_bytes=140 * 10**9,
    zone_capacity=4,
)
BUILT_IN: dict[str, LocalProfile] = {profile.name: profile for profile in (INSTANT, AWS_P5)}


def load_profile(value: str, time_scale: float | None = None) -> LocalProfile:
    """The profile ``value`` names: a built-in's name or a file's path; ``time_scale`` (set: the environment's)
    replaces the profile's own. ConfigError (one line, without the variable's name: its caller names it) for an
    unknown name, an unreadable file or a bad value."""
    text = value.strip() or INSTANT.name
    profile = BUILT_IN[text] if text in BUILT_IN else _from_file(Path(text))
    if time_scale is not None:
        if not 0 < time_scale <= 1000:
            raise ConfigError(f"time scale {time_scale}: must be more than 0 and at most 1000")
        profile = profile.model_copy(update={"time_scale": time_scale})
    return profile


def _from_file(path: Path) -> LocalProfile:
    names = ", ".join(sorted(BUILT_IN))
    if path.suffix not in (".toml", ".json", ".yaml", ".yml"):
        raise ConfigError(f"not a built-in profile ({names}) nor a .toml, .json or .yaml file")
    try:
        raw = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror or exc})") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(raw)
        elif path.suffix == ".json":
            data = json.loads(raw)
        else:
            data = yaml.safe_load(raw)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path} is not valid {path.suffix[1:]}: {first}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a table of the profile's keys")
    try:
        name = re.sub(r"[^A-Za-z0-9._-]", "-", path.stem)[:40] or "custom"
        return LocalProfile.model_validate({"name": name, **data})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "profile"
        raise ConfigError(f"{path}: {where}: {error['msg']}") from None
