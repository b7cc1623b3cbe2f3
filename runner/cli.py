"""``finetune-runner run --spec PATH|s3://…|oss://…|file://…``: the on-host agent's entry point.

Started from user-data or a systemd unit. Exit codes: 0 the job completed (or was already complete), 1 it failed, 2
the spec or the command line is invalid (nothing was started), 3 no report key (AWS) or sealed storage token
(Alibaba with a runner storage role) came for this instance within the storage patience (nothing was started,
nothing could be reported; systemd starts the runner again, which waits once more), 4 the trainer's user could not
be kept from the instance metadata service (``runner.metadata_guard``: the trainer was not started, the ``failed``
report says why), 75 this attempt was interrupted by a notice or a stop after committing what it could (the job
continues on another instance).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import re
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from handlers.attempt_keys import SEALED_KEY_PREFIX_PATTERN
from handlers.spec import REPORT_KEY_PREFIX_PATTERN, JobSpec, parse_spec
from runner.agent import Runner
from runner.environment import RUNNER_ENVIRONMENT, environment_help
from runner.exit_codes import (
    EXIT_BAD_SPEC,
    EXIT_COMPLETED,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NO_METADATA_GUARD,
    EXIT_NO_REPORT_KEY,
)
from runner.options import RunnerOptions
from runner.own_paths import check_own_paths
from runner.reports.key import report_key
from runner.reports.key_object import (
    FetchedKey,
    NoReportKey,
    fetch_attempt_key,
    fetch_sealed_key,
    own_key,
    storage_credentials,
)
from runner.storage.attempt_credentials import AttemptCredentials
from runner.storage.base import StorageError
from runner.storage.open import open_store

log = logging.getLogger("runner")

# Where key objects lie (the runner appends its instance id): AWS's s3://<bucket>/attempt-keys/<role id>:, or
# Alibaba's oss://<bucket>/attempt-keys/ (sealed with the report key of FINETUNE_REPORT_SECRET)
KEY_FROM_ENV = "FINETUNE_KEY_FROM"


async def load_spec(location: str, credentials: AttemptCredentials | None = None) -> JobSpec:
    """Read the spec from a local path or an object-store URI (signed with ``credentials`` when given), then
    validate it; ValueError saying why there is none to run."""
    if location.startswith(("s3://", "oss://", "file://")):
        parsed = urlparse(location)
        base, _, name = location.rpartition("/")
        if not name or (not parsed.netloc and not location.startswith("file://")):
            raise ValueError(f"--spec {location!r} does not name an object")
        store = open_store(base + "/", credentials)
        try:
            raw = await store.get_bytes(name)
        finally:
            await store.close()
        if raw is None:
            raise ValueError(f"--spec {location} does not exist")
        return parse_spec(raw)
    try:
        return parse_spec(Path(location).read_bytes())
    except OSError as exc:
        raise ValueError(f"cannot read --spec {location}: {exc.strerror}") from None


def default_work_dir(spec: JobSpec) -> Path:
    root = os.environ.get("FINETUNE_WORK_DIR") or os.path.join(tempfile.gettempdir(), "finetune-runner")
    return Path(root) / spec.job_id / f"attempt-{spec.attempt}"


async def run(args: argparse.Namespace) -> int:
    """Key object first where the user data names one (with a storage role the spec is readable only with the
    credentials it holds), then the spec, then the runner."""
    held: list[AttemptCredentials] = []
    try:
        return await _run(args, held)
    finally:
        for credentials in held:
            await credentials.close()


def _cannot_start(message: str, code: int) -> int:
    """Nothing was started: say why on stderr, one line; the exit code."""
    print(f"finetune-runner: {message}", file=sys.stderr)
    return code


def _cannot_report(exc: Exception) -> int:
    """No report key (or no storage to read it from): unsigned, a report would be refused, so nothing starts."""
    return _cannot_start(f"{exc}; this runner cannot report, so it starts nothing", EXIT_NO_REPORT_KEY)


async def _run(args: argparse.Namespace, held: list[AttemptCredentials]) -> int:
    try:
        options = RunnerOptions.from_env(Path())
    except (StorageError, ValueError) as exc:  # a bad setting in the environment: nothing has started
        return _cannot_start(str(exc), EXIT_BAD_SPEC)
    patience = options.storage_patience_seconds
    key_from = os.environ.get(KEY_FROM_ENV) or None
    if key_from is not None and not any(
        re.fullmatch(pattern, key_from) for pattern in (REPORT_KEY_PREFIX_PATTERN, SEALED_KEY_PREFIX_PATTERN)
    ):
        return _cannot_start(
            f"{KEY_FROM_ENV}={key_from!r} is neither s3://<bucket>/attempt-keys/<role id>: nor "
            "oss://<bucket>/attempt-keys/",
            EXIT_BAD_SPEC,
        )
    try:
        fetched = await _fetch_key(key_from, patience) if key_from is not None else None
    except (NoReportKey, StorageError) as exc:
        return _cannot_report(exc)
    credentials = _hold(held, fetched)
    try:
        spec = await load_spec(args.spec, credentials)
    except (StorageError, ValueError) as exc:
        return _cannot_start(str(exc), EXIT_BAD_SPEC)
    if key_from is not None and spec.report_key_from not in (None, key_from):
        return _cannot_start(f"the spec's report_key_from is not {KEY_FROM_ENV} ({key_from})", EXIT_BAD_SPEC)
    if fetched is None and spec.report_key_from is not None:
        try:
            fetched = await _fetch_key(spec.report_key_from, patience)
        except (NoReportKey, StorageError) as exc:
            return _cannot_report(exc)
        credentials = _hold(held, fetched)
    key: str | None = None
    if fetched is not None:
        try:
            key = own_key(spec, fetched)
        except NoReportKey as exc:
            return _cannot_report(exc)
    work_dir = Path(args.work_dir) if args.work_dir else default_work_dir(spec)
    log.info("job %s attempt %d, work dir %s", spec.job_id, spec.attempt, work_dir)
    if options.trainer.user is not None:  # a trainer of another user: no name of ours may be its to change
        try:
            check_own_paths(work_dir)
        except OSError as exc:  # PermissionError: a path someone else could change
            return _cannot_start(f"{exc}; the runner starts no trainer here", EXIT_BAD_SPEC)
    if credentials is not None:
        log.info("storage: the attempt's own session (until %s), not the instance's", credentials.current.expiration)
    try:
        store = open_store(spec.checkpoint_uri, credentials) if credentials is not None else None
        runner = Runner(
            spec,
            dataclasses.replace(options, work_dir=work_dir),
            store=store,
            report_key=key,
            credentials=credentials,
        )
    except (StorageError, ValueError) as exc:  # a bad setting in the environment: nothing has started
        return _cannot_start(str(exc), EXIT_BAD_SPEC)
    return await runner.run()


async def _fetch_key(key_from: str, patience: float) -> FetchedKey:
    """The key object at ``key_from``; NoReportKey or StorageError when there is none to read."""
    if key_from.startswith("oss://"):  # Alibaba: sealed with this attempt's report key, from the user data
        key = report_key()
        if not key:
            raise NoReportKey(f"{key_from} holds sealed objects, and no FINETUNE_REPORT_SECRET opens them")
        return await fetch_sealed_key(key_from, key, patience)
    return await fetch_attempt_key(key_from, patience)


def _hold(held: list[AttemptCredentials], fetched: FetchedKey | None) -> AttemptCredentials | None:
    """The storage session the key object carries, if any (closed when the run ends)."""
    credentials = storage_credentials(fetched) if fetched is not None else None
    if credentials is not None:
        held.append(credentials)
    return credentials


# What --help says of each exit code (the module's docstring says why each is what it is).
EXIT_MEANINGS = {
    EXIT_COMPLETED: "the job completed (or was already complete)",
    EXIT_FAILED: "it failed",
    EXIT_BAD_SPEC: "the spec, the command line or a setting is invalid: nothing was started",
    EXIT_NO_REPORT_KEY: "no report key or sealed storage token came in time: nothing was started or reported",
    EXIT_NO_METADATA_GUARD: "the trainer's user could not be kept from the metadata service: nothing started",
    EXIT_INTERRUPTED: "interrupted by a notice or a stop after committing what it could: the job goes on elsewhere",
}
EXIT_CODES_HELP = "\n".join(["exit status:", *(f"  {code:<4}{meaning}" for code, meaning in EXIT_MEANINGS.items())])


class ShowVersion(argparse.Action):
    """``--version``: the installed distribution's version (the one in VERSION), looked up only when asked."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"{parser.prog} {version('finetune-chatops')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print(f"{parser.prog} (not installed: no version)")
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="finetune-runner",
        description="The on-host agent: runs one attempt of a fine-tune job (started by an instance's user data or "
        "its systemd unit), reports its progress and commits its checkpoints.",
    )
    parser.add_argument("--version", action=ShowVersion)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser(
        "run",
        help="run one attempt of a fine-tune job",
        description="Run one attempt of the job the spec describes, until it completes, fails or is interrupted.",
        epilog=f"{EXIT_CODES_HELP}\n\n{environment_help(RUNNER_ENVIRONMENT)}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run_parser.add_argument("--spec", required=True, help="job spec: a path, s3://…, oss://… or file://…")
    run_parser.add_argument("--work-dir", help="local scratch space (default $FINETUNE_WORK_DIR or a temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("FINETUNE_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
