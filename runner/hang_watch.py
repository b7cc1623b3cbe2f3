"""The hang watchdog: a trainer that stops stepping without exiting is found, its stacks recorded.

A rank stuck in a collective, a driver call or a deadlock keeps its process alive, so nothing exits and nothing is
reported wrong: the bot would only hear the job go silent half an hour later. The watchdog calls the trainer hung
when no step came for ``max(floor, k × its measured step time)`` (the job spec's :class:`~handlers.spec.HangRule`,
a recipe setting), and never

* before its first step (a start's imports, a model's load, a restore take what they take), nor
* while a save is moving: a checkpoint directory at or past the trainer's step, without its completion marker, whose
  files changed within the limit (a save that writes nothing for the whole limit is as hung as a step that long).

:class:`HangJudge` decides from what it is shown and the time it is given (tests bring their own clock);
:class:`HangWatch` feeds it from the progress file and the output directory. Once it is hung, :func:`dump_stacks`
records where every process of the trainer is: ``py-spy dump`` where it is installed, else the interpreter's own
``faulthandler``, which every rank registers on :data:`~runner.stop_request.STACK_SIGNAL` when it creates its
:class:`~runner.stop_request.StopRequest` (the callback does at start). What follows (the trainer ended, restarted
from the newest committed checkpoint, a second hang ends the attempt) is the supervisor's
(:mod:`runner.supervise`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import stat
import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from handlers.reports import StackFrame
from handlers.spec import HangRule
from runner.local_checkpoints import is_marked_complete, list_checkpoint_dirs
from runner.progress import ProgressTail
from runner.stop_request import STACK_SIGNAL, stacks_path

Clock = Callable[[], float]
SaveMark = tuple[str, int, int, int]  # a save in flight: its directory, files, bytes, newest change (ns)
STACK_BYTES = 256 * 1024  # of one process's dump, read at most
STACK_WAIT_SECONDS = 3.0  # for a process's dump to be written once signalled
PY_SPY_SECONDS = 20.0  # for one py-spy dump
TOP_FRAMES = 5  # of the hanging thread, reported to the bot


@dataclass(frozen=True, slots=True)
class Stall:
    """The trainer is hung: at ``step`` (the last it reached; None: no step this attempt), with no step for
    ``seconds``, against ``limit`` seconds."""

    step: int | None
    seconds: float
    limit: float


@dataclass(slots=True)
class Stacks:
    """Where the trainer's processes were when it was found hung: each dumped process's text, and the top frames of
    the hanging thread (the first dumped process's main thread: the trainer's own process, or its lowest rank)."""

    dumps: dict[int, str] = field(default_factory=dict)
    frames: list[StackFrame] = field(default_factory=list)
    how: str = "none"  # "py-spy", "faulthandler" or "none" (no process could say)

    def text(self) -> str:
        return "\n".join(f"--- pid {pid} ---\n{dump}" for pid, dump in sorted(self.dumps.items()))


class HangJudge:
    """One trainer's watch: decides from the steps and the save it is shown, at the times it is given."""

    def __init__(self, rule: HangRule, steps_seen: int, now: float) -> None:
        """``steps_seen``: the progress file's step count when this trainer started (what came before is an earlier
        trainer's)."""
        self.rule = rule
        self._counted = steps_seen
        self._stepped = False  # this trainer trained a step
        self._last_activity = now
        self._marks: deque[tuple[float, int]] = deque(maxlen=20)  # (when seen, step lines so far)
        self._save: SaveMark | None = None

    @property
    def step_seconds(self) -> float | None:
        """About how long one step takes, from when this trainer's steps were seen (its start left out)."""
        if len(self._marks) < 2:
            return None
        (first_at, first), (last_at, last) = self._marks[0], self._marks[-1]
        return (last_at - first_at) / (last - first) if last > first and last_at > first_at else None

    @property
    def limit(self) -> float:
        return self.rule.limit(self.step_seconds)

    def observe(self, now: float, steps_seen: int, step: int | None, save: SaveMark | None) -> Stall | None:
        """What the watch sees at ``now``: the step lines read so far, the newest step and a save in flight (None:
        none). A :class:`Stall` once the trainer is hung, else None."""
        if steps_seen > self._counted:
            self._counted = steps_seen
            self._stepped = True
            self._marks.append((now, steps_seen))
            self._last_activity = now
        if save is not None and save != self._save:
            self._last_activity = now  # a save writing its files is no hang, however long the step
        self._save = save
        if not self._stepped:
            return None
        stalled = now - self._last_activity
        limit = self.limit
        return Stall(step=step, seconds=stalled, limit=limit) if stalled >= limit else None


class HangWatch:
    """Feeds a :class:`HangJudge` from the attempt's progress (refreshed by the progress loop) and output
    directory, every ``poll_seconds``, until the trainer is hung."""

    def __init__(
        self,
        rule: HangRule,
        progress: ProgressTail,
        output_dir: Path,
        clock: Clock = time.monotonic,
        poll_seconds: float = 0.5,
    ) -> None:
        self.rule = rule
        self.progress = progress
        self.output_dir = output_dir
        self.clock = clock
        self.poll_seconds = poll_seconds

    async def hung(self) -> Stall:
        """Returns once the trainer started now is hung (never, if it keeps stepping: cancel it)."""
        judge = HangJudge(self.rule, self.progress.steps_seen, self.clock())
        poll = min(self.poll_seconds, self.rule.floor_seconds / 4)
        while True:
            await asyncio.sleep(poll)
            step = self.progress.state.step
            save = await asyncio.to_thread(save_in_flight, self.output_dir, step)
            stall = judge.observe(self.clock(), self.progress.steps_seen, step, save)
            if stall is not None:
                return stall


def save_in_flight(output_dir: Path, step: int | None) -> SaveMark | None:
    """The save the trainer is writing, as a mark that changes whenever its files do: the newest checkpoint
    directory at or past ``step`` not marked complete (an older one is a killed trainer's leftover). Only
    ``lstat`` (and Hugging Face's small state file, read without following a link): nothing else the trainer put there
    is followed or read."""
    found = list_checkpoint_dirs(output_dir)
    if not found:
        return None
    newest = found[-1]
    if (step is not None and newest.step < step) or is_marked_complete(newest.path):
        return None
    files = size = changed = 0
    with contextlib.suppress(OSError):
        changed = newest.path.lstat().st_mtime_ns
        for root, dirs, names in os.walk(newest.path):
            for name in [*names, *dirs]:
                with contextlib.suppress(OSError):
                    info = os.lstat(os.path.join(root, name))
                    files += 1
                    size += info.st_size if stat.S_ISREG(info.st_mode) else 0
                    changed = max(changed, info.st_mtime_ns)
    return (newest.path.name, files, size, changed)


# -- where every process is -----------------------------------------------------------------------------------


def dump_stacks(pids: Iterable[int], stop_file: Path) -> Stacks:
    """Every Python stack of the trainer's processes ``pids``: by py-spy where it is installed (and may attach),
    else by ``faulthandler`` in the processes that registered it (their stacks file exists). Blocking: run it in a
    worker thread. A process that can say nothing is left out."""
    stacks = Stacks()
    py_spy = shutil.which("py-spy")
    for pid in sorted(pids):
        dump = _py_spy(py_spy, pid) if py_spy else None
        how = "py-spy"
        if dump is None:
            dump, how = _faulthandler(pid, stop_file), "faulthandler"
        if not dump:
            continue
        stacks.dumps[pid] = dump
        if not stacks.frames:
            stacks.frames = top_frames(dump)[:TOP_FRAMES]
            stacks.how = how
    return stacks


def _py_spy(program: str, pid: int) -> str | None:
    try:
        done = subprocess.run(
            [program, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=PY_SPY_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and top_frames(done.stdout) else None


def _faulthandler(pid: int, stop_file: Path) -> str:
    """Signal ``pid`` to write its stacks, and read what it wrote (only a process whose stacks file exists: the
    signal's default action would end any other)."""
    path = stacks_path(stop_file, pid)
    before = _file_size(path)
    if before is None:
        return ""
    try:
        os.kill(pid, STACK_SIGNAL)
    except (ProcessLookupError, PermissionError):
        return ""
    deadline = time.monotonic() + STACK_WAIT_SECONDS
    seen = before
    while time.monotonic() < deadline:  # the dump is written at once, in the signal handler; wait until it settles
        time.sleep(0.05)
        size = _file_size(path)
        if size is not None and size > before and size == seen:
            break
        seen = size if size is not None else seen
    return _read_from(path, before)


def _file_size(path: str) -> int | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _read_from(path: str, offset: int) -> str:
    """What the trainer's process wrote to its stacks file past ``offset``: never through a link, at most
    :data:`STACK_BYTES`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.pread(fd, STACK_BYTES, offset).decode(errors="replace")
    finally:
        os.close(fd)


_FAULTHANDLER_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.+?)\s*$')
_PY_SPY_FRAME = re.compile(r"^\s+(?P<function>\S.*?) \((?P<file>.+):(?P<line>\d+)\)\s*$")


def top_frames(dump: str) -> list[StackFrame]:
    """The hanging thread's frames, most recent first: faulthandler's current thread (the main thread, where the
    signal is handled), or py-spy's main thread; else the first thread the dump lists."""
    blocks: list[tuple[str, list[StackFrame]]] = []
    for line in dump.splitlines():
        if line.startswith(("Current thread", "Thread ")):
            blocks.append((line, []))
            continue
        match = _FAULTHANDLER_FRAME.match(line) or _PY_SPY_FRAME.match(line)
        if match and blocks:
            frame = StackFrame(function=match["function"], file=match["file"], line=int(match["line"]))
            blocks[-1][1].append(frame)
    for header, frames in blocks:
        if frames and (header.startswith("Current thread") or '"MainThread"' in header):
            return frames
    return next((frames for _, frames in blocks if frames), [])
