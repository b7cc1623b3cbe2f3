"""Everything the trainer started dies: before its next start, and when the attempt ends.

A model's own code runs in the trainer (ms-swift trusts it), and it may leave a daemon behind that outlives the
trainer: one that would race the root runner's next hand-over of ``output/``, its final-output upload, or simply
hold the GPUs. :meth:`TrainerBox.sweep` ends every such process and returns only when none is left.

The trainer's processes are the **process tree the runner owns**: every descendant of the runner that was not
there before the first trainer started. The runner is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so an orphan
of the trainer (double-forked, in a session or process group of its own) is re-parented to the runner, not to
init, and stays in the tree; an unprivileged process has no way out of it. The sweep stops them all first
(``SIGSTOP``: a stopped process cannot fork) until a pass finds none running, then kills them.

Why not the others:

* a sweep of the trainer user's uid would also catch a process the trainer did not fork (a crontab entry of
  that user), but one host may run several runners with one trainer user (the local cloud, a gang's nodes side by
  side in the tests): it would kill a neighbour's trainer. It is reliable only with a user per runner.
* a cgroup v2 of the runner's is the kernel's own box, but it is often not writable inside a container (the
  local cloud's and the tests' runners run in one) and needs a delegated subtree under systemd.
* the trainer's process group or session alone: a child leaves it with one ``setsid()``.

This is also what remains when the runner is not root and the trainer runs as the runner itself: there is no
uid to tell them apart, and the tree is the box.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

PROC = Path("/proc")
_PR_SET_CHILD_SUBREAPER = 36
PASSES = 1000  # stop passes before giving up on a stop that never settles (a fork faster than the scan)


def become_subreaper() -> None:
    """Orphans below the runner come to it, not to init, so they stay its descendants. Linux only."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _pids() -> Iterator[int]:
    with contextlib.suppress(OSError):
        for entry in os.scandir(PROC):
            if entry.name.isdigit():
                yield int(entry.name)


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (from ``/proc``; empty where there is none)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid in _pids():
        try:
            stat = (PROC / str(pid) / "stat").read_bytes()
        except OSError:
            continue
        # "pid (comm) state ppid …": comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[0] not in (b"Z", b"X", b"x"):
            children[int(fields[1])].append(pid)
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class TrainerBox:
    """The trainer's processes: the runner's descendants but those it had before (see the module docstring)."""

    def __init__(self) -> None:
        """Made before the first trainer starts: the runner's own children then (none of the trainer's) are
        spared."""
        become_subreaper()
        self._runner_own = frozenset(descendants(os.getpid()))

    def members(self) -> list[int]:
        """The trainer's processes alive now."""
        return [pid for pid in descendants(os.getpid()) if pid not in self._runner_own]

    def sweep(self, spare: int | None = None) -> list[int]:
        """Kill every process of the trainer's and return once none is alive; the pids killed. ``spare``: a pid
        the caller reaps itself (the trainer's main process, awaited by asyncio); any other one that is the
        runner's child is reaped here, so no zombie is left behind."""
        stopped: set[int] = set()
        for _ in range(PASSES):
            running = [pid for pid in self.members() if pid not in stopped]
            if not running:
                break
            for pid in running:
                _signal(pid, signal.SIGSTOP)
                stopped.add(pid)
        else:
            log.error("the trainer's processes kept forking through %d passes: killing what was found", PASSES)
        killed: list[int] = []
        while True:
            alive = self.members()
            if not alive:
                break
            for pid in alive:
                _signal(pid, signal.SIGKILL)
                killed.append(pid)
            _reap(alive, spare)
            time.sleep(0.01)
        _reap(killed, spare)
        if killed:
            log.warning("killed %d process(es) the trainer left behind: %s", len(set(killed)), sorted(set(killed)))
        return sorted(set(killed))


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _reap(pids: list[int], spare: int | None) -> None:
    """Collect those of ``pids`` that are our children (orphans re-parented to the runner, its subreaper)."""
    for pid in set(pids):
        if pid == spare:
            continue
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
