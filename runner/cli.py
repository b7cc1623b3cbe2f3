"""``finetune-runner run --spec PATH|s3://…|oss://…|file://…``: the on-host agent's entry point.

Started from user-data or a systemd unit. Exit codes: 0 the job completed (or was already complete), 1 it
failed, 2 the spec or the command line is invalid (nothing was started), 3 (AWS) no report key came for this
instance within the storage patience (nothing was started, nothing could be reported; systemd starts the runner
again, which waits once more), 4 the trainer's user could not be kept from the instance metadata service
(``runner.metadata_guard``: the trainer was not started, the ``failed`` report says why), 75 this attempt was
interrupted by a notice or a stop after committing what it could (the job continues on another instance).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from handlers.spec import JobSpec, SpecError, parse_spec
from runner.agent import EXIT_BAD_SPEC, EXIT_NO_REPORT_KEY, Runner, RunnerOptions
from runner.reports.key_object import NoReportKey, fetch_report_key
from runner.storage.base import StorageError
from runner.storage.open import open_store

log = logging.getLogger("runner")


async def load_spec(location: str) -> JobSpec:
    """Read the spec from a local path or an object-store URI, then validate it."""
    if location.startswith(("s3://", "oss://", "file://")):
        parsed = urlparse(location)
        base, _, name = location.rpartition("/")
        if not name or (not parsed.netloc and not location.startswith("file://")):
            raise SpecError(f"--spec {location!r} does not name an object")
        store = open_store(base + "/")
        try:
            raw = await store.get_bytes(name)
        finally:
            await store.close()
        if raw is None:
            raise SpecError(f"--spec {location} does not exist")
        return parse_spec(raw)
    try:
        return parse_spec(Path(location).read_bytes())
    except OSError as exc:
        raise SpecError(f"cannot read --spec {location}: {exc.strerror}") from None


def default_work_dir(spec: JobSpec) -> Path:
    root = os.environ.get("FINETUNE_WORK_DIR") or os.path.join(tempfile.gettempdir(), "finetune-runner")
    return Path(root) / spec.job_id / f"attempt-{spec.attempt}"


async def run(args: argparse.Namespace) -> int:
    try:
        spec = await load_spec(args.spec)
    except (SpecError, StorageError, ValueError) as exc:
        print(f"finetune-runner: {exc}", file=sys.stderr)
        return EXIT_BAD_SPEC
    work_dir = Path(args.work_dir) if args.work_dir else default_work_dir(spec)
    log.info("job %s attempt %d, work dir %s", spec.job_id, spec.attempt, work_dir)
    try:
        options = RunnerOptions.from_env(work_dir)
    except (StorageError, ValueError) as exc:  # a bad setting in the environment: nothing has started
        print(f"finetune-runner: {exc}", file=sys.stderr)
        return EXIT_BAD_SPEC
    key: str | None = None
    if spec.report_key_from is not None:
        try:
            key = await fetch_report_key(spec, options.storage_patience_seconds)
        except (NoReportKey, StorageError) as exc:  # unsigned, a report would be refused: say it here, start nothing
            print(f"finetune-runner: {exc}; this runner cannot report, so it starts nothing", file=sys.stderr)
            return EXIT_NO_REPORT_KEY
    try:
        runner = Runner(spec, options, report_key=key)
    except (StorageError, ValueError) as exc:  # a bad setting in the environment: nothing has started
        print(f"finetune-runner: {exc}", file=sys.stderr)
        return EXIT_BAD_SPEC
    return await runner.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune-runner", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="run one attempt of a fine-tune job")
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
