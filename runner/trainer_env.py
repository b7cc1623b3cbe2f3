"""The trainer's environment: its own, named variable by variable, never the runner's whole one.

The runner holds what a trainer must not see: the report key (``FINETUNE_REPORT_SECRET``), the cloud's
credentials, the bot's settings when a local cloud instance runs on the bot's machine. The trainer gets:

* process basics from the runner's environment: ``PATH``, ``LANG``, ``LANGUAGE``, ``LC_*``, ``TZ``, ``TERM``,
  ``LD_LIBRARY_PATH``, ``CUDA_*``, ``NCCL_*``, ``NVIDIA_*``, ``OMP_NUM_THREADS``; torchrun's and ms-swift's own
  (``NPROC_PER_NODE``, ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); the hubs' switches
  (``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``, ``TRANSFORMERS_OFFLINE``, ``HF_ENDPOINT``, ``USE_HF``,
  ``MODELSCOPE_DOMAIN``); and the names the runner's ``FINETUNE_TRAINER_ENV`` lists (e.g. ``HF_TOKEN``), none of
  them a credential or a setting of the runner or the bot;
* ``HOME`` (its own when it runs as a user of its own), and ``USER`` / ``LOGNAME`` then;
* ``PYTHONPATH``: the runner's package first, then the recipe's, then ``FINETUNE_TRAINER_PYTHONPATH`` when the
  runner was given one;
* what the recipe names (the spec's ``env``), and the trainer contract variables, set last.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runner.trainer_user import TrainerUser

TRAINER_ENV_SETTING = "FINETUNE_TRAINER_ENV"
TRAINER_PYTHONPATH_SETTING = "FINETUNE_TRAINER_PYTHONPATH"
BASICS = frozenset(
    {
        "PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "LD_LIBRARY_PATH",
        "OMP_NUM_THREADS",
        "NPROC_PER_NODE",
        "NNODES",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_ENDPOINT",
        "USE_HF",
        "MODELSCOPE_DOMAIN",
    }
)
BASIC_PREFIXES = ("LC_", "CUDA_", "NCCL_", "NVIDIA_")
# Never passed on, whatever FINETUNE_TRAINER_ENV says: the runner's and the bot's settings (the report key among
# them), cloud credentials and endpoints, Redis, the chat platforms' tokens.
NEVER = re.compile(r"^(FINETUNE_|AWS_|ALIBABA_CLOUD_|ALIYUN_|OSS_|REDIS|SLACK_|DINGTALK_)")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class TrainerSetup:
    """How the runner starts its trainer: as whom, and what of the runner's environment it passes on."""

    user: TrainerUser | None = None
    passed: frozenset[str] = field(default_factory=frozenset)  # FINETUNE_TRAINER_ENV
    pythonpath: str | None = None  # FINETUNE_TRAINER_PYTHONPATH

    @classmethod
    def from_env(cls, environ: Mapping[str, str], user: TrainerUser | None) -> TrainerSetup:
        """ValueError for a name that is not one, or one that must never reach a trainer."""
        names = [name.strip() for name in environ.get(TRAINER_ENV_SETTING, "").split(",") if name.strip()]
        for name in names:
            if not _NAME.match(name):
                raise ValueError(f"{TRAINER_ENV_SETTING}: {name!r} is not a variable name")
            if NEVER.match(name):
                raise ValueError(f"{TRAINER_ENV_SETTING}: {name} is never passed to a trainer")
        return cls(user=user, passed=frozenset(names), pythonpath=environ.get(TRAINER_PYTHONPATH_SETTING) or None)


def passes(name: str, setup: TrainerSetup) -> bool:
    """Whether the runner's variable ``name`` reaches the trainer."""
    if NEVER.match(name):
        return False
    return name in BASICS or name.startswith(BASIC_PREFIXES) or name in setup.passed


def build_environment(
    setup: TrainerSetup,
    recipe_env: Mapping[str, str],
    contract: Mapping[str, str],
    home: Path,
    import_dir: Path,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The trainer's whole environment (``home`` is used when the trainer runs as a user of its own)."""
    source = os.environ if environ is None else environ
    env = {name: value for name, value in source.items() if passes(name, setup)}
    env.setdefault("PATH", os.defpath)
    if setup.user is not None:
        env.update(HOME=str(home), USER=setup.user.name, LOGNAME=setup.user.name)
    elif "HOME" in source:
        env["HOME"] = source["HOME"]
    env.update(recipe_env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(contract)
    paths = [str(import_dir), recipe_env.get("PYTHONPATH"), setup.pythonpath]
    env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    return env
