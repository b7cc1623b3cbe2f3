"""The environment variables ``finetune-runner run`` reads, in one table: ``--help`` lists it, and
tests/test_cli_help.py holds the code to it (every name the runner's side of the package reads is here, and
nothing else).

The trainer's own variables (``FINETUNE_OUTPUT_DIR`` and the rest of ``runner.trainer``'s contract) are the
runner's to set, not to read, and are not listed.
"""

from __future__ import annotations

import textwrap

RUNNER_ENVIRONMENT: dict[str, tuple[str, ...]] = {
    "the attempt": ("FINETUNE_KEY_FROM", "FINETUNE_REPORT_SECRET", "FINETUNE_WORK_DIR", "FINETUNE_LOG_LEVEL"),
    "periods and patience": (
        "FINETUNE_STOP_GRACE_SECONDS",
        "FINETUNE_PROGRESS_SECONDS",
        "FINETUNE_SYNC_SECONDS",
        "FINETUNE_SETTLE_SECONDS",
        "FINETUNE_STORAGE_PATIENCE_SECONDS",
        "FINETUNE_CONTROL_POLL_SECONDS",
        "FINETUNE_NOTICE_POLL_SECONDS",
        "FINETUNE_REPORT_RESERVE_SECONDS",
        "FINETUNE_CREDENTIALS_CHECK_SECONDS",
        "FINETUNE_CREDENTIALS_WAIT_SECONDS",
        "FINETUNE_COLLECTIVE_TIMEOUT_SECONDS",
        "FINETUNE_GANG_WAIT_SECONDS",
        "FINETUNE_EARLY_SAVE_SECONDS",
    ),
    "the trainer": (
        "FINETUNE_TRAINER_USER",
        "FINETUNE_METADATA_GUARD",
        "FINETUNE_TRAINER_ENV",
        "FINETUNE_TRAINER_PYTHONPATH",
        "FINETUNE_TRAINER_ECHO",
    ),
    "checkpoint storage": (
        "FINETUNE_S3_PART_MIB",
        "FINETUNE_S3_CONCURRENCY",
        "FINETUNE_S3_ADDRESSING",
        "FINETUNE_STORAGE_REGION",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_MAX_ATTEMPTS",
        "OSS_ENDPOINT",
        "OSS_REGION",
        "ALIBABA_CLOUD_ACCESS_KEY_ID",
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
        "ALIBABA_CLOUD_SECURITY_TOKEN",
        "ALIBABA_CLOUD_ECS_METADATA",
    ),
    "the metadata service (spot notices)": ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "ALIBABA_CLOUD_METADATA_ENDPOINT"),
}


def environment_help(groups: dict[str, tuple[str, ...]], width: int = 100) -> str:
    """The table as help text: a heading, then each group's names wrapped under its title."""
    if not groups:
        return "environment variables: none"
    lines = ["environment variables:"]
    for title, names in groups.items():
        lines += textwrap.wrap(
            " ".join(names), width, initial_indent=f"  {title}: ", subsequent_indent="    ", break_on_hyphens=False
        )
    return "\n".join(lines)
