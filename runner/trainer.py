"""The trainer subprocess: started from an argv list (never a shell), output streamed to a log file.

The runner owns these variables of the trainer's environment (and ``${NAME}`` in argv expands to them):
``FINETUNE_OUTPUT_DIR`` (where it writes ``checkpoint-<step>/``), ``FINETUNE_RESUME_FROM`` (a restored
checkpoint, or empty), ``FINETUNE_PROGRESS_FILE`` (JSON lines of step / loss the runner turns into progress
reports), ``FINETUNE_STOP_FILE`` (the stop request, see ``runner.stop_request``), ``FINETUNE_SWIFT_PLUGIN``
(the ms-swift plugin shipped in this package, for ``--external_plugins``) and ``FINETUNE_PYTHON`` (the runner's
own interpreter: on a GPU host the one environment known to hold the runner, and the training stack when it was
installed with the ``trainer`` / ``swift`` extras). ``PYTHONPATH`` starts with a directory
that holds only this ``runner`` package, so a trainer in another Python environment imports the callback and the
plugin from the very files the runner runs, and nothing else of the runner's environment.

The rest of its environment is its own (``runner.trainer_env``: never the report key, a credential or the bot's
settings), and a runner that is root starts it as an unprivileged user (``runner.trainer_user``). Whatever it
starts ends with it (``runner.trainer_box``), and what it writes the runner reaches without following a link it may
have put on the way (``runner.beneath``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from handlers.failures import Failure
from runner.errors import RunnerError
from runner.save_request import save_path, save_watched_path
from runner.stop_request import STACKS_SUFFIX, STOP_FILE_ENV, STOP_FILE_NAME, stopped_path, watched_path
from runner.trainer_box import TrainerBox, become_subreaper, descendants
from runner.trainer_env import TrainerSetup, build_environment
from runner.trainer_user import TRAINER_USER_ENV, TrainerUser

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
LINE_LIMIT = 2048  # bytes of one output line kept in memory (the log file gets all of it)
_PR_SET_PDEATHSIG = 1
_PACKAGE_DIR = Path(__file__).resolve().parent
SWIFT_PLUGIN = _PACKAGE_DIR / "swift" / "finetune_spot_plugin.py"
TrainerState = Literal["running", "exited-cleanly", "exited"]


class TrainerStartError(RunnerError):
    """The trainer could not be started at all; ``failure`` says why (for the ``failed`` report), the message
    in English."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.english)
        self.failure = failure


@dataclass(frozen=True, slots=True)
class TrainerFiles:
    """Where the runner and its trainer meet, all under the runner's work directory."""

    output_dir: Path
    progress_file: Path
    log_path: Path
    stop_file: Path
    import_dir: Path
    home: Path  # the trainer's HOME when it runs as a user of its own (caches, ~/.config)

    @property
    def work_dir(self) -> Path:
        return self.stop_file.parent

    @classmethod
    def under(cls, work_dir: Path) -> TrainerFiles:
        return cls(
            home=work_dir / "home",
            output_dir=work_dir / "output",
            progress_file=work_dir / "progress.jsonl",
            log_path=work_dir / "trainer.log",
            stop_file=work_dir / STOP_FILE_NAME,
            import_dir=work_dir / "pythonpath",
        )


def expand_argv(command: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """Put the runner's own paths into argv for trainers that take them as flags (``swift sft --output_dir``).

    Only the runner's variables (the keys of ``values``) are replaced: nothing else is expanded and no shell is
    involved. An option whose value is an empty ``${FINETUNE_RESUME_FROM}`` (a fresh start) is left out together
    with its flag.
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


def find_program(argv0: str, env: Mapping[str, str]) -> str | None:
    """The executable ``argv0`` names, looked up the way exec will (``PATH`` of the trainer's environment)."""
    if os.sep in argv0:
        return argv0 if os.path.isfile(argv0) and os.access(argv0, os.X_OK) else None
    return shutil.which(argv0, path=env.get("PATH", os.defpath))


def cannot_start(
    command: Sequence[str], env: Mapping[str, str], files: TrainerFiles, setup: TrainerSetup | None = None
) -> Failure | None:
    """Why the trainer's program cannot be started (not found, not executable, by the trainer's user too), or
    None if it can be."""
    setup = setup or TrainerSetup()
    full_env, ours = trainer_environment(env, files, None, setup)
    program = (expand_argv(command[:1], ours) or [""])[0]
    found = find_program(program, full_env)
    if found is None:
        return start_failure(program, full_env)
    if setup.user is not None and not runnable_by(found, setup.user):
        return Failure.of("trainer-out-of-reach", program=found, user=setup.user.name, setting=TRAINER_USER_ENV)
    return None


def runnable_by(program: str, user: TrainerUser) -> bool:
    """Whether ``user`` may run ``program``: every directory on its path searchable, the file executable (by the
    mode bits; a trainer in ``/root`` is not, whatever ``os.access`` says to the root runner)."""
    named = Path(program).absolute()
    for path in (named, named.resolve()):  # the way to a link and the way to where it leads
        for place in [*reversed(path.parents), path]:
            try:
                info = place.stat()
            except OSError:
                return False
            shift = 6 if info.st_uid == user.uid else 3 if info.st_gid in (user.gid, *user.groups) else 0
            if not (info.st_mode >> shift) & 0o1:
                return False
    return True


def trainer_environment(
    env: Mapping[str, str], files: TrainerFiles, resume_from: Path | None, setup: TrainerSetup | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """The trainer's whole environment, and the runner's own variables in it (what ``${NAME}`` expands to)."""
    ours = {
        "FINETUNE_OUTPUT_DIR": str(files.output_dir),
        "FINETUNE_RESUME_FROM": str(resume_from) if resume_from else "",
        "FINETUNE_PROGRESS_FILE": str(files.progress_file),
        STOP_FILE_ENV: str(files.stop_file),
        "FINETUNE_SWIFT_PLUGIN": str(SWIFT_PLUGIN),
        "FINETUNE_PYTHON": sys.executable,
    }
    full_env = build_environment(setup or TrainerSetup(), env, ours, files.home, files.import_dir)
    return full_env, ours


def _link_package(import_dir: Path) -> None:
    """``import_dir/runner`` → this package: the one thing the trainer's ``PYTHONPATH`` adds."""
    import_dir.mkdir(parents=True, exist_ok=True)
    link = import_dir / _PACKAGE_DIR.name
    if link.is_symlink() and link.resolve() == _PACKAGE_DIR:
        return
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    elif link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(_PACKAGE_DIR, target_is_directory=True)


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value)


def _die_with_parent() -> None:
    """In the child: if the runner dies, so does the trainer (nobody would upload its checkpoints, and a
    restarted runner would start a second trainer on the same GPUs). Linux only; elsewhere a no-op."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class TrainerProcess:
    def __init__(
        self,
        process: asyncio.subprocess.Process,
        files: TrainerFiles,
        echo: bool,
        others: frozenset[int] = frozenset(),
        sink: BinaryIO | None = None,
        box: TrainerBox | None = None,
    ) -> None:
        self.process = process
        self._sink = sink
        self.files = files
        self.echo = echo
        self.log_path = files.log_path
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.killed = False
        self.frozen = False
        self._others = others  # the runner's processes from before the trainer: never the trainer's to kill
        self._box = box
        self._pump = asyncio.create_task(self._stream_output())

    @classmethod
    async def start(
        cls,
        command: Sequence[str],
        env: Mapping[str, str],
        resume_from: Path | None,
        files: TrainerFiles,
        echo: bool = True,
        setup: TrainerSetup | None = None,
        box: TrainerBox | None = None,
    ) -> TrainerProcess:
        """Start the trainer; :class:`TrainerStartError` when its program cannot be run at all. ``box``: what of
        the runner's processes is the trainer's, all of it ended once the trainer's own process has exited."""
        setup = setup or TrainerSetup()
        full_env, ours = trainer_environment(env, files, resume_from, setup)
        argv = expand_argv(command, ours)
        # A request left by an earlier trainer of this attempt must not stop this one.
        for stale in (files.stop_file, Path(watched_path(files.stop_file)), Path(stopped_path(files.stop_file))):
            stale.unlink(missing_ok=True)
        # An earlier trainer's stacks files: a process of this one that reuses a pid must not look registered.
        for stale in files.work_dir.glob(f"{files.stop_file.name}{STACKS_SUFFIX}*"):
            stale.unlink(missing_ok=True)
        for stale in (Path(save_path(files.stop_file)), Path(save_watched_path(files.stop_file))):  # nor save it
            stale.unlink(missing_ok=True)
        _link_package(files.import_dir)
        sink = _open_log(files.log_path)  # before the trainer can put anything in its place
        switch: dict[str, Any] = {}
        if setup.user is not None:
            setup.user.hand_over(files.work_dir, [files.output_dir, files.home])
            switch = setup.user.popen_args()
        else:
            files.output_dir.mkdir(parents=True, exist_ok=True)
        # Orphans of the trainer (a launcher that died before its ranks) come to us, so kill() still finds them.
        become_subreaper()
        others = frozenset(descendants(os.getpid()))
        who = setup.user.name if setup.user else "the runner's user"
        log.info("starting trainer as %s: %s (resume from %s)", who, argv, resume_from or "scratch")
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=full_env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                # Its own process group: a Ctrl-C at the runner's terminal must not reach the trainer unsaved.
                start_new_session=True,
                preexec_fn=_die_with_parent,
                **switch,
            )
        except OSError as exc:
            sink.close()
            raise TrainerStartError(start_failure(argv[0], full_env, exc)) from exc
        return cls(process, files, echo, others, sink, box)

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    @property
    def stopped_on_request(self) -> bool:
        """The ranks agreed to stop on a request and saved (``runner.stop_request``): not done, stopped."""
        return os.path.exists(stopped_path(self.files.stop_file))

    @property
    def watches_stop_file(self) -> bool:
        """The trainer said it watches the stop file (``runner.stop_request``), so it needs no signal."""
        return os.path.exists(watched_path(self.files.stop_file))

    @property
    def watches_save_requests(self) -> bool:
        """The trainer said it honours save requests (``runner.save_request``): an early signal asks it for a fresh
        checkpoint rather than committing the newest existing one."""
        return os.path.exists(save_watched_path(self.files.stop_file))

    async def wait(self) -> int:
        """The trainer's exit code, once it and everything it started are gone. asyncio's own wait also waits
        for the output pipe to close, which a daemon the trainer left holding it would put off forever: so the
        exit of the trainer's own process is awaited first, then its box is swept (the pipe closes), then that."""
        if not await self._exited():  # no pidfd here: asyncio's wait, then the sweep
            await self.process.wait()
        if self._box is not None:
            await asyncio.to_thread(self._box.sweep, self.process.pid)
        code = await self.process.wait()
        await self._pump
        return code

    async def _exited(self) -> bool:
        """Until the trainer's own process has exited (its pidfd turns readable), whoever still holds its output;
        False at once where there is no pidfd to wait on (not Linux, a kernel before 5.3)."""
        if self.process.returncode is not None:
            return True
        try:
            pidfd = os.pidfd_open(self.process.pid)
        except ProcessLookupError:  # exited and reaped already: its code is on its way to asyncio
            return True
        except (OSError, AttributeError):
            return False
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()

        def exited() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(pidfd, exited)
        try:
            await readable
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        return True

    def request_stop(self) -> None:
        """Ask the trainer to save and exit: the stop file for every rank, and SIGTERM to a trainer that does not
        watch it (a launcher would lose the signal or pass it on at a different moment to each rank)."""
        stop = self.files.stop_file
        stop.parent.mkdir(parents=True, exist_ok=True)
        try:
            _create_stop_file(stop)
        except OSError as exc:  # the trainer holds the name (it may add files to the work dir): signal it instead
            log.warning("cannot write the stop request %s: %s", stop, exc)
        if not self.watches_stop_file:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def terminate(self) -> None:
        """The older name of :meth:`request_stop`."""
        self.request_stop()

    def state(self) -> TrainerState:
        """Running, exited 0 on its own, or exited otherwise (killed, crashed)."""
        if self.running:
            return "running"
        return "exited-cleanly" if self.process.returncode == 0 and not self.killed else "exited"

    def freeze(self) -> None:
        """Hold the trainer where it is (SIGSTOP to it and everything below it): a step it would train now could
        not be committed before the deadline, and a SIGTERM would start a save that cannot finish. Undone by
        :meth:`thaw`; :meth:`kill` ends a frozen trainer as well."""
        self.frozen = True
        self._signal_all(signal.SIGSTOP)

    def thaw(self) -> None:
        """Let a frozen trainer go on (a save was found to fit after all)."""
        self.frozen = False
        self._signal_all(signal.SIGCONT)

    def _signal_all(self, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)
        for pid in [self.process.pid, *descendants(self.process.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def kill(self) -> None:
        """The deadline passed: kill the trainer and everything it started (ranks in sessions of their own too)."""
        self.killed = True
        doomed = descendants(self.process.pid)
        # Orphans re-parented to the runner (we are their subreaper) belong to the trainer as well.
        ours = [self.process.pid, *doomed, *self._others]
        doomed += [pid for pid in descendants(os.getpid()) if pid not in ours]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for pid in [self.process.pid, *doomed]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    async def _stream_output(self) -> None:
        """Copy output to the log as it comes; progress bars redraw with ``\\r``, so split on both. What is held in
        memory is bounded: a line that grows past ``LINE_LIMIT`` bytes without ending (a binary blob, a bar that
        never returns) is kept by its start, and the rest of it is dropped until it ends."""
        assert self.process.stdout is not None
        pending = b""
        skipping = False  # inside a line already kept by its start
        with self._sink or _open_log(self.log_path) as sink:
            while chunk := await self.process.stdout.read(65536):
                sink.write(chunk)
                sink.flush()
                *lines, pending = (pending + chunk).replace(b"\r", b"\n").split(b"\n")
                for line in lines:
                    if skipping:
                        skipping = False
                        continue
                    self._keep(line)
                if len(pending) > LINE_LIMIT:
                    if not skipping:
                        self._keep(pending)
                        skipping = True
                    pending = b""
            if not skipping:
                self._keep(pending)

    def _keep(self, line: bytes) -> None:
        text = line[:LINE_LIMIT].decode(errors="replace").rstrip()
        if text:
            self.tail.append(text)
            if self.echo:
                print(f"[trainer] {text}", file=sys.stderr, flush=True)


def _open_log(path: Path) -> BinaryIO:
    """The trainer's log, for appending; never through a link (a trainer may add files to the work dir)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o644), "ab")


def _create_stop_file(stop: Path) -> None:
    """Create the stop request at once (empty, so no reader sees half of it), never through a link the trainer
    put where it goes: the runner may be root, the trainer not."""
    staging = stop.with_name(stop.name + ".tmp")
    staging.unlink(missing_ok=True)
    os.close(os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
    staging.replace(stop)


def start_failure(argv0: str, env: Mapping[str, str], exc: OSError | None = None) -> Failure:
    """Why the trainer cannot start, for the ``failed`` report."""
    if exc is None and os.path.exists(argv0):
        exc = PermissionError()
    if exc is None or isinstance(exc, FileNotFoundError):
        if os.sep in argv0:
            return Failure.of("trainer-not-found", program=argv0)
        return Failure.of("trainer-not-on-path", program=argv0, path=env.get("PATH", os.defpath))
    if isinstance(exc, PermissionError):
        return Failure.of("trainer-not-executable", program=argv0)
    return Failure.of("trainer-not-started", program=argv0, error=str(exc.strerror or exc))
