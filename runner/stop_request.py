"""The stop request between the runner and the processes that train, however they were launched.

A signal reaches one process, and launchers do not pass it on faithfully: ``swift sft`` runs the real trainer in a
child and dies of the SIGTERM itself, torchrun forwards it to each rank at a different moment and kills them 30 s
later, and a signal to the whole process group also kills DataLoader workers mid-batch. So the runner asks with a
file as well: it creates ``$FINETUNE_STOP_FILE``, which every rank can see, whatever stands between them.

The trainer side (this module's :class:`StopRequest`, used by ``runner.hf.callback``) says it watches that file by
creating ``$FINETUNE_STOP_FILE.watched`` as soon as it starts; from then on the runner sends no signal at all and
the file alone is the request. A trainer that never says so gets a SIGTERM to its main process too (the older
contract, for scripts that only handle the signal).

At every step boundary each rank looks at the file (and at its own SIGTERM flag), and when ``torch.distributed`` is
initialised the ranks combine what they saw with an all-reduce (MAX), so they all stop after the same step: a
collective save then neither hangs nor mixes steps. Only the trainer process imports torch, and only when the
ranks really are distributed; the runner agent imports nothing but the names below.

A plain PyTorch loop::

    stop = StopRequest()                      # at start-up, before the slow parts
    for step, batch in enumerate(loader, start=first_step):
        train_step(batch)
        if stop.agreed():                     # every rank calls it after every step (it is a collective)
            save_checkpoint(step)             # checkpoint-<step>/, then barrier, then rank 0 writes the marker
            break
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import IO, Any

log = logging.getLogger(__name__)

STOP_FILE_ENV = "FINETUNE_STOP_FILE"
"""The variable that names the stop request file (set by the runner in the trainer's environment)."""

STOP_FILE_NAME = "stop-request"
"""The stop request file's name, in the runner's work directory beside the trainer's ``output/``."""

WATCHED_SUFFIX = ".watched"
"""Appended to the stop file's path: the trainer watches the file, so the runner sends it no signal."""


STOPPED_SUFFIX = ".stopped"
"""Appended to the stop file's path: the ranks agreed to stop on a request and saved (written by each node's local
rank 0). A node of a gang whose runner made no request learns from it that its trainer ended on a peer's notice,
not because the job is done."""


STACKS_SUFFIX = ".stacks."
"""Appended to the stop file's path, then the process id: where a trainer process writes its Python stacks when the
runner sends it :data:`STACK_SIGNAL` (a hung trainer: ``runner.hang_watch``). The file's presence says the process
takes that signal; the runner sends it to no other (its default action would end the process)."""

STACK_SIGNAL = signal.SIGUSR1
"""The signal that makes a trainer process dump every thread's stack (``faulthandler``) into its stacks file."""

_stack_files: list[IO[str]] = []  # kept open for as long as faulthandler may write to them (the process's life)


def stacks_path(stop_file: str | os.PathLike[str], pid: int) -> str:
    return f"{os.fspath(stop_file)}{STACKS_SUFFIX}{pid}"


def register_stack_dump(stop_file: str | None) -> None:
    """Make :data:`STACK_SIGNAL` dump this process's threads into its stacks file, next to the stop file. The dump
    is the interpreter's own (``faulthandler``, C level): it is written even while the main thread waits in a
    collective or a sleep that never returns. Once per process; a failure only loses the stacks."""
    if stop_file is None or not hasattr(faulthandler, "register"):  # not on Windows
        return
    path = stacks_path(stop_file, os.getpid())
    if any(handle.name == path for handle in _stack_files):
        return
    try:
        handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 (open for the process's life, see above)
        faulthandler.register(STACK_SIGNAL, file=handle, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError) as exc:
        log.warning("cannot register the stack dump at %s: %s", path, exc)
        return
    _stack_files.append(handle)


def watched_path(stop_file: str | os.PathLike[str]) -> str:
    return os.fspath(stop_file) + WATCHED_SUFFIX


def stopped_path(stop_file: str | os.PathLike[str]) -> str:
    return os.fspath(stop_file) + STOPPED_SUFFIX


def _touch(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(fd)


class StopRequest:
    """Trainer side of the stop protocol: the runner's file, a SIGTERM, and the ranks' agreement on them.

    Attributes:
        path: the stop request file (``$FINETUNE_STOP_FILE``), or None when the trainer runs without the runner.
        signalled: a SIGTERM (or :meth:`request`) was received by this process.
    """

    def __init__(self, path: str | None = None, install_signal_handler: bool = True) -> None:
        """Say that the file is watched, and (in the main thread) make SIGTERM set a flag.

        Args:
            path: the stop file; defaults to ``$FINETUNE_STOP_FILE`` (unset or empty: only signals count).
            install_signal_handler: set False to leave SIGTERM alone (the caller routes it to :meth:`request`).
        """
        if path is None:
            path = os.environ.get(STOP_FILE_ENV) or None
        self.path: str | None = path
        self.signalled = False
        if self.path is not None:
            try:
                _touch(watched_path(self.path))
            except OSError as exc:  # then the runner signals as well, which still works for a direct trainer
                log.warning("cannot write %s: %s", watched_path(self.path), exc)
            register_stack_dump(self.path)  # a hung rank's stacks, when the runner asks (runner/hang_watch.py)
        if install_signal_handler:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._on_sigterm)
            else:  # signal.signal() only works in the main thread
                log.warning("StopRequest created outside the main thread: SIGTERM handler not installed")

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag: the trainer may be in the middle of a backward pass or of writing a checkpoint.
        self.signalled = True

    def request(self) -> None:
        """Same as receiving SIGTERM."""
        self.signalled = True

    def mark_stopped(self) -> None:
        """Say the ranks agreed to stop (on this node's local rank 0; once is enough, again is harmless)."""
        if self.path is None or os.environ.get("LOCAL_RANK", "0") != "0":
            return
        try:
            _touch(stopped_path(self.path))
        except OSError as exc:
            log.warning("cannot write %s: %s", stopped_path(self.path), exc)

    @property
    def requested(self) -> bool:
        """What this process alone knows: a signal came, or the runner's file exists."""
        return self.signalled or (self.path is not None and os.path.exists(self.path))

    def agreed(self, device: Any = None) -> bool:
        """Whether the job stops now, the same answer on every rank.

        A collective when ``torch.distributed`` is initialised: every rank must call it at the same point (after
        the same step). ``device`` is where the flag lives for the all-reduce (the rank's GPU under NCCL); by
        default the current CUDA device for NCCL, else the CPU.
        """
        return bool(agree_max([int(self.requested)], device)[0])


def agree_max(values: Sequence[int], device: Any = None) -> list[int]:
    """The largest of each value over every rank, in one all-reduce (MAX); the values themselves outside
    ``torch.distributed``. A collective when it is initialised: every rank calls it at the same point. ``device``:
    where the values live for it (the rank's GPU under NCCL; by default the current CUDA device, else the CPU)."""
    dist = initialised_distributed()
    if dist is None or dist.get_world_size() < 2:
        return list(values)
    import torch

    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    agreed = torch.tensor(list(values), dtype=torch.int64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return [int(value) for value in agreed.tolist()]


def initialised_distributed() -> Any:
    """``torch.distributed`` if this process is one rank of an initialised group, else None (no torch import)."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def barrier() -> None:
    """Wait for every rank (no-op outside ``torch.distributed``): all files of a checkpoint written, on all ranks."""
    dist = initialised_distributed()
    if dist is not None and dist.get_world_size() > 1:
        dist.barrier()


def is_main_rank() -> bool:
    """Rank 0 of the group, or the only process."""
    dist = initialised_distributed()
    return dist is None or dist.get_rank() == 0
