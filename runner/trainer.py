"""The trainer subprocess: started from an argv list (never a shell), output streamed to a log file.

The runner owns three variables of the trainer's environment: ``FINETUNE_OUTPUT_DIR`` (where it writes
``checkpoint-<step>/``), ``FINETUNE_RESUME_FROM`` (a restored checkpoint, or empty) and
``FINETUNE_PROGRESS_FILE`` (JSON lines of step / loss the runner turns into progress reports).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1


def expand_argv(command: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """Put the runner's own paths into argv for trainers that take them as flags (``swift sft --output_dir``).

    Only ``${FINETUNE_OUTPUT_DIR}``, ``${FINETUNE_RESUME_FROM}`` and ``${FINETUNE_PROGRESS_FILE}`` are
    replaced: nothing else is expanded and no shell is involved. An option whose value is an empty
    ``${FINETUNE_RESUME_FROM}`` (a fresh start) is left out together with its flag.
    """
    argv: list[str] = []
    for item in command:
        if item == "${FINETUNE_RESUME_FROM}" and not values["FINETUNE_RESUME_FROM"]:
            if argv and argv[-1].startswith("--"):
                argv.pop()
            continue
        for name, value in values.items():
            item = item.replace("${" + name + "}", value)
        argv.append(item)
    return argv


def _die_with_parent() -> None:
    """In the child: if the runner dies, so does the trainer (nobody would upload its checkpoints, and a
    restarted runner would start a second trainer on the same GPUs). Linux only; elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class TrainerProcess:
    def __init__(self, process: asyncio.subprocess.Process, log_path: Path, echo: bool) -> None:
        self.process = process
        self.echo = echo
        self.log_path = log_path
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.killed = False
        self._pump = asyncio.create_task(self._stream_output())

    @classmethod
    async def start(
        cls,
        command: Sequence[str],
        env: Mapping[str, str],
        output_dir: Path,
        resume_from: Path | None,
        progress_file: Path,
        log_path: Path,
        echo: bool = True,
    ) -> TrainerProcess:
        ours = {
            "FINETUNE_OUTPUT_DIR": str(output_dir),
            "FINETUNE_RESUME_FROM": str(resume_from) if resume_from else "",
            "FINETUNE_PROGRESS_FILE": str(progress_file),
        }
        full_env = {**os.environ, **env, **ours}
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        argv = expand_argv(command, ours)
        output_dir.mkdir(parents=True, exist_ok=True)
        log.info("starting trainer: %s (resume from %s)", argv, resume_from or "scratch")
        process = await asyncio.create_subprocess_exec(
            *argv,
            env=full_env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            # Its own process group: a Ctrl-C at the runner's terminal must not reach the trainer unsaved.
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        return cls(process, log_path, echo)

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    async def wait(self) -> int:
        code = await self.process.wait()
        await self._pump
        return code

    def terminate(self) -> None:
        """Ask the trainer to save and exit (SIGTERM to its main process, which forwards to its workers)."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """The deadline passed: kill the trainer's whole process group."""
        self.killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    async def _stream_output(self) -> None:
        """Copy output to the log as it comes; progress bars redraw with ``\\r``, so split on both."""
        assert self.process.stdout is not None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        pending = b""
        with self.log_path.open("ab") as sink:
            while chunk := await self.process.stdout.read(65536):
                sink.write(chunk)
                sink.flush()
                *lines, pending = (pending + chunk).replace(b"\r", b"\n").split(b"\n")
                for line in lines:
                    self._keep(line)
            self._keep(pending)

    def _keep(self, line: bytes) -> None:
        text = line.decode(errors="replace").rstrip()
        if text:
            self.tail.append(text)
            if self.echo:
                print(f"[trainer] {text}", file=sys.stderr, flush=True)
