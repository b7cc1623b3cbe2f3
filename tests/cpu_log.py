"""Where the suite's CPU goes: per test, the CPU of the pytest process and of every process it started.

On only when ``FINETUNE_TEST_CPU_LOG`` names a directory: each process (each xdist worker) then appends one JSON
line per test to ``<dir>/<worker>.jsonl`` with the wall time, this process's CPU, its descendants' CPU (the reaped
ones from ``RUSAGE_CHILDREN``, the live ones from ``/proc``) and the programs it started (``python -m <module>``
or the program's name). ``python -m tests.cpu_log <dir>`` sums them up by file and by program. Wall time alone
misleads on a shared 2-core machine: a test that waits on a server is slow but cheap, a trainer start is both.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import pytest

ENV = "FINETUNE_TEST_CPU_LOG"
TICKS = os.sysconf("SC_CLK_TCK")


def _descendants_cpu(root: int) -> float:
    """CPU seconds of the live (and zombie) descendants of ``root``, each with what it reaped of its own."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        cpu[pid] = sum(int(value) for value in fields[11:15]) / TICKS  # utime stime cutime cstime
    total = 0.0
    for pid, seconds in cpu.items():
        ancestor = parents.get(pid, 0)
        while ancestor > 1 and ancestor != root:
            ancestor = parents.get(ancestor, 0)
        if ancestor == root:
            total += seconds
    return total


def _cpu_now() -> tuple[float, float]:
    """(this process, its descendants) in CPU seconds."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime + _descendants_cpu(os.getpid())


def _program(args: Any) -> str:
    """``-m module`` for a Python child, else the program's base name."""
    if isinstance(args, (str, bytes)):
        args = [args]
    words = [os.fsdecode(word) for word in (args or [])]
    if "-m" in words[:-1]:
        return "-m " + words[words.index("-m") + 1]
    return os.path.basename(words[0]) if words else "?"


class CpuLog:
    """The pytest plugin: one JSON line per test."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.out: TextIO = (directory / f"{worker}.jsonl").open("a")
        self.started: list[str] = []
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event in ("subprocess.Popen", "os.posix_spawn"):
            self.started.append(_program(args[1]))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        self.started = []
        wall, (own, children) = time.monotonic(), _cpu_now()
        try:
            return (yield)
        finally:
            own_after, children_after = _cpu_now()
            record = {
                "id": item.nodeid,
                "wall": round(time.monotonic() - wall, 3),
                "self": round(own_after - own, 3),
                "children": round(max(children_after - children, 0.0), 3),
                "started": self.started,
            }
            self.out.write(json.dumps(record) + "\n")
            self.out.flush()


def register(config: pytest.Config) -> None:
    """Install the plugin when ``FINETUNE_TEST_CPU_LOG`` is set (called from conftest's ``pytest_configure``)."""
    directory = os.environ.get(ENV)
    if directory and not config.pluginmanager.has_plugin("cpu_log"):
        config.pluginmanager.register(CpuLog(Path(directory)), "cpu_log")


def summarise(directory: Path, top: int = 40) -> str:
    """The heaviest files and tests by CPU (self + children), and the programs started most."""
    records = [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.open()]
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    starts: Counter[str] = Counter()
    starts_by_file: dict[str, Counter[str]] = defaultdict(Counter)
    for record in records:
        name = record["id"].split("::")[0]
        row = by_file[name]
        row[0] += record["wall"]
        row[1] += record["self"]
        row[2] += record["children"]
        row[3] += 1
        starts.update(record["started"])
        starts_by_file[name].update(record["started"])
    total_cpu = sum(row[1] + row[2] for row in by_file.values())
    wall_sum = sum(record["wall"] for record in records)
    lines = [f"{len(records)} tests, CPU {total_cpu:.0f} s (self + children), wall summed {wall_sum:.0f} s"]
    lines.append(f"{'file':<44} {'tests':>5} {'wall':>7} {'self':>7} {'child':>7} {'cpu%':>5}  starts")
    ranked = sorted(by_file.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))
    for name, (wall, own, children, count) in ranked[:top]:
        share = 100 * (own + children) / total_cpu if total_cpu else 0.0
        common = ", ".join(f"{program} x{n}" for program, n in starts_by_file[name].most_common(3))
        lines.append(f"{name:<44} {int(count):>5} {wall:>7.0f} {own:>7.0f} {children:>7.0f} {share:>5.1f}  {common}")
    lines.append("programs started: " + ", ".join(f"{program} x{n}" for program, n in starts.most_common(12)))
    heavy = sorted(records, key=lambda record: -(record["self"] + record["children"]))[:top]
    lines.append("heaviest tests:")
    lines.extend(f"  {r['self'] + r['children']:7.1f} cpu {r['wall']:7.1f} wall  {r['id']}" for r in heavy)
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarise(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 40))
