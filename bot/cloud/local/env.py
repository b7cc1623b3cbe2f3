"""What a local instance's process may see of the bot's environment: what a real instance would have, no more.

A real instance gets its image's basics, its role's access to the checkpoint store, and its user data; never the
bot's settings. A local instance is a process the bot starts, so it would inherit everything the bot holds (the
Slack and DingTalk tokens, the master report secret, the webhook token, the Redis URL) unless told otherwise: it
gets only the names below. Its runner adds its spec, its metadata endpoint and its attempt's report key.
"""

from __future__ import annotations

from collections.abc import Mapping

# The process basics an image provides.
BASICS = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "PYTHONDONTWRITEBYTECODE",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CUDA_VISIBLE_DEVICES",
    }
)
# The store (the local cloud's stand-in for an instance's role: its endpoint, region and credentials, and the bucket's
# own region, as user data says it), the model hub's cache and offline switches, the runner's storage knobs.
PREFIXES = ("LC_", "AWS_", "OSS_", "ALIBABA_CLOUD_", "HF_", "TRANSFORMERS_", "FINETUNE_S3_", "FINETUNE_STORAGE_REGION")
# The runner's own tuning knobs (an image or a unit may set them on a real instance).
RUNNER_KNOBS = frozenset(
    {
        "FINETUNE_CONTROL_POLL_SECONDS",
        "FINETUNE_LOG_LEVEL",
        "FINETUNE_METADATA_GUARD",
        "FINETUNE_NOTICE_POLL_SECONDS",
        "FINETUNE_PROGRESS_SECONDS",
        "FINETUNE_PYTHON",
        "FINETUNE_REPORT_RESERVE_SECONDS",
        "FINETUNE_SETTLE_SECONDS",
        "FINETUNE_STOP_GRACE_SECONDS",
        "FINETUNE_STORAGE_PATIENCE_SECONDS",
        "FINETUNE_SWIFT_PLUGIN",
        "FINETUNE_SYNC_SECONDS",
        "FINETUNE_TRAINER_ECHO",
        "FINETUNE_TRAINER_ENV",
        "FINETUNE_TRAINER_PYTHONPATH",
        "FINETUNE_TRAINER_USER",
    }
)


def instance_environment(bot_environment: Mapping[str, str]) -> dict[str, str]:
    """The part of ``bot_environment`` a local instance (and so its runner) starts with."""
    return {
        name: value
        for name, value in bot_environment.items()
        if name in BASICS or name in RUNNER_KNOBS or name.startswith(PREFIXES)
    }
