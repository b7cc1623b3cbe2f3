"""The bot's command line as an operator uses it: serve until SIGTERM, a console chat on stdin."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fakes.ports import free_port
from tests.servers import wait_http

pytestmark = pytest.mark.scenario  # every test here runs a subprocess (tests/markers.py)


def bot_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env.update({"FINETUNE_STATE_DIR": str(tmp_path / "state"), "FINETUNE_LOG_LEVEL": "INFO", **extra})
    return env


def test_serve_answers_health_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc = _start_serve(tmp_path, port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert 'finetune_jobs{state="RUNNING"} 0' in response.read().decode()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    assert "permissions: a job's owner, team and admins act on it; channels see their own jobs" in output
    assert "no policy.admins" in output  # the model in force, said at start
    assert "Traceback" not in output
    assert not _valkey_serving(tmp_path / "state" / "redis")  # the embedded server went down with the bot


def test_a_sigterm_to_the_whole_process_group_stops_the_loops_before_the_embedded_valkey(tmp_path: Path) -> None:
    """Ctrl-C at a terminal, ``kill -TERM -<pgid>``, a supervisor signalling the group: the signal reaches the bot
    alone (its Valkey leads a session of its own), so no loop finds the server gone while it stops."""
    # Its own group, as a shell's job is: the signal below goes to all of it.
    proc = _start_serve(tmp_path, free_port(), start_new_session=True)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    assert "INFO bot: stopping" in output  # it did stop by the signal, cleanly
    assert "cannot reach Redis" not in output and "Traceback" not in output, output
    assert not _valkey_serving(tmp_path / "state" / "redis")  # stopped by the bot, last


async def test_a_sigterm_ends_the_demo_as_its_end_does() -> None:
    """The demo's bot stops in order (its ``async with`` left, its Valkey last) and the status says which signal:
    a real SIGTERM to this process, taken by the demo's handler."""
    from bot.demo import until_signalled

    started, left = asyncio.Event(), asyncio.Event()

    async def demo() -> int:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            left.set()
        return 0

    running = asyncio.create_task(until_signalled(demo()))
    await started.wait()
    os.kill(os.getpid(), signal.SIGTERM)
    assert await running == 128 + signal.SIGTERM
    assert left.is_set()


def _valkey_serving(data_dir: Path) -> bool:
    from bot.redis_server import _is_our_server

    pid_file = data_dir / "valkey.pid"
    deadline = time.monotonic() + 10
    while pid_file.exists() and time.monotonic() < deadline:
        if not _is_our_server(int(pid_file.read_text().strip() or 0), data_dir):
            return False
        time.sleep(0.1)
    return pid_file.exists() and _is_our_server(int(pid_file.read_text().strip() or 0), data_dir)


def test_console_chat_reads_commands_from_stdin(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bot.cli", "chat"],
        input="help\nstart llama-70b\nstop ft-zzzz\nlist\n",
        env=bot_env(tmp_path, FINETUNE_HTTP_PORT="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "/finetune start <recipe> [key=value …] [deadline=36h] [budget=120]" in result.stdout
    assert "unknown recipe 'llama-70b'; known recipes: deepseek-7b, tiny" in result.stdout
    assert "no job ft-zzzz" in result.stdout
    assert "no jobs yet" in result.stdout


def test_the_console_is_who_the_process_runs_as_whatever_user_the_environment_names(tmp_path: Path) -> None:
    real = pwd.getpwuid(os.getuid()).pw_name
    assert real != "alice"
    config = tmp_path / "bot.yaml"
    config.write_text("policy:\n  admins: ['console:alice']\n")
    result = subprocess.run(
        [sys.executable, "-m", "bot.cli", "chat"],
        input="costs\n",
        env=bot_env(tmp_path, FINETUNE_CONFIG=str(config), FINETUNE_HTTP_PORT="0", USER="alice", LOGNAME="alice"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"finetune-bot chat as console:{real} " in result.stdout and "console:alice" not in result.stdout
    # The console's own user is an admin of its console (the config names alice only): its costs are answered.
    assert "you are on no team" not in result.stdout and "no job was active in this window" in result.stdout


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("policy:\n  max_concurrent_nodes: 0\n", "policy.max_concurrent_nodes"),
        # A key under a name it never has (one spelling per key: no old name is read as today's).
        ("aws:\n  bucket: my-finetune-checkpoints\n  image_id: ami-0abc\n  drill_notice: PT5M\n", "aws.drill_notice"),
        # A launch region without an image or a template (issue 51): named by its place.
        (
            "aws:\n  bucket: my-finetune-checkpoints\n  region: us-east-1\n  regions:\n"
            "    us-west-2: {subnets: [subnet-0abc]}\n",
            "aws.regions.us-west-2: Value error, set image_id",
        ),
        # A typo: the closest key there is named.
        ("policy:\n  admin: ['console:ana']\n", "policy.admin: no such key (did you mean policy.admins?)"),
        # A recipe's hang watchdog that would call every step a hang.
        (
            "recipes:\n  - name: slow\n    description: d\n    model: m\n    command: [python]\n"
            "    hang:\n      factor: 0\n",
            "recipes.0.hang.factor: Input should be greater than or equal to 2",
        ),
    ],
)
def test_a_bad_config_file_is_one_clear_error(tmp_path: Path, text: str, named: str) -> None:
    config = tmp_path / "bot.yaml"
    config.write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "bot.cli", "serve"],
        env=bot_env(tmp_path, FINETUNE_CONFIG=str(config), FINETUNE_HTTP_PORT="0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert named in result.stderr and "Traceback" not in result.stderr


def test_the_aws_cloud_without_its_settings_is_one_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bot.cli", "serve"],
        env=bot_env(tmp_path, FINETUNE_CLOUD="aws", FINETUNE_HTTP_PORT="0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "FINETUNE_CLOUD=aws needs an aws: section" in result.stderr and "Traceback" not in result.stderr


def test_the_aws_cloud_without_the_runner_role_id_is_one_clear_error(tmp_path: Path) -> None:
    """Without it no runner could find its report key: the bot says so at start rather than launch mute runners."""
    config = "aws:\n  bucket: my-finetune-checkpoints\n  image_id: ami-0abc\n"
    result = subprocess.run(
        [sys.executable, "-m", "bot.cli", "serve"],
        env=bot_env(tmp_path, FINETUNE_CLOUD="aws", FINETUNE_HTTP_PORT="0", FINETUNE_CONFIG_YAML=config),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("finetune-bot:")]
    assert "aws.runner_role_id is not set: the runner stack's output RunnerRoleId" in line
    assert "Traceback" not in result.stderr


# -- one owner per state dir, and one clean line for every bad setting ------------------------------------------


def _start_serve(tmp_path: Path, port: int, start_new_session: bool = False) -> subprocess.Popen[str]:
    """``serve`` on the embedded defaults, once it answers ``/healthz`` (killed if it never does)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "serve"],
        env=bot_env(tmp_path, FINETUNE_HTTP_PORT=str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=start_new_session,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


def _refused(tmp_path: Path, command: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", command],
        env=bot_env(tmp_path, **env),
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )


def _valkey_pid(tmp_path: Path) -> int:
    return int((tmp_path / "state" / "redis" / "valkey.pid").read_text().strip())


def test_a_second_bot_on_the_same_state_is_refused_and_the_first_stays_healthy(tmp_path: Path) -> None:
    from bot.redis_server import _is_our_server

    port = free_port()
    first = _start_serve(tmp_path, port)
    try:
        valkey = _valkey_pid(tmp_path)
        for command in ("serve", "chat"):
            second = _refused(tmp_path, command, FINETUNE_HTTP_PORT=str(free_port()))
            assert second.returncode == 2, second.stderr
            lines = second.stderr.strip().splitlines()
            assert len(lines) == 1 and "already runs on FINETUNE_STATE_DIR" in lines[0], second.stderr
            assert f"pid {first.pid}" in lines[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            assert response.status == 200
        assert _valkey_pid(tmp_path) == valkey and _is_our_server(valkey, tmp_path / "state" / "redis")
        first.send_signal(signal.SIGTERM)
        output, _ = first.communicate(timeout=30)
        assert first.returncode == 0 and "Traceback" not in output and "stopping Valkey" not in output
    finally:
        if first.poll() is None:
            first.kill()


def test_the_state_of_a_killed_bot_is_taken_over_and_its_orphaned_valkey_stopped(tmp_path: Path) -> None:
    from bot.redis_server import _is_our_server

    first = _start_serve(tmp_path, free_port())
    orphan = _valkey_pid(tmp_path)
    first.kill()  # SIGKILL: no clean-up; the kernel lets go of its lock, its Valkey lives on
    first.wait(timeout=30)
    assert _is_our_server(orphan, tmp_path / "state" / "redis")
    port = free_port()
    second = _start_serve(tmp_path, port)
    try:
        assert not _is_our_server(orphan, tmp_path / "state" / "redis")
        assert _valkey_pid(tmp_path) != orphan
        second.send_signal(signal.SIGTERM)
        output, _ = second.communicate(timeout=30)
        assert second.returncode == 0 and f"stopping Valkey pid {orphan}" in output
    finally:
        if second.poll() is None:
            second.kill()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FINETUNE_CLOUD", "gcp"),
        ("FINETUNE_HTTP_PORT", "abc"),
        ("FINETUNE_HTTP_PORT", "70000"),
        ("FINETUNE_LOCAL_GRACE_SECONDS", "-1"),
        ("FINETUNE_LOCAL_DIALECT", "gcp"),
        ("FINETUNE_LOCAL_CHECKPOINTS", "ftp://bucket/x"),
        ("FINETUNE_LOG_LEVEL", "LOUD"),
    ],
)
@pytest.mark.parametrize("command", ["serve", "chat"])
def test_each_bad_setting_is_one_line_naming_the_variable(
    tmp_path: Path, command: str, variable: str, value: str
) -> None:
    env = {"FINETUNE_HTTP_PORT": "0", variable: value}
    result = _refused(tmp_path, command, **env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"finetune-bot: {variable}="), result.stderr
    assert not (tmp_path / "state" / "redis").exists()  # refused before anything started


def test_a_port_in_use_is_one_line_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _refused(tmp_path, "serve", FINETUNE_HTTP_PORT=str(port))
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.startswith("finetune-bot:")]
    assert len(lines) == 1 and f"port {port}" in lines[0] and "FINETUNE_HTTP_PORT" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not _valkey_serving(tmp_path / "state" / "redis")  # what had started was stopped again


def test_chat_takes_a_port_of_its_own_unless_told(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):  # in use already is as good: serve's default port is taken either way
            taken.bind(("127.0.0.1", 8080))
            taken.listen()
        env = {key: value for key, value in bot_env(tmp_path).items() if key != "FINETUNE_HTTP_PORT"}
        result = subprocess.run(
            [sys.executable, "-m", "bot.cli", "chat"],
            input="list\n",
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    assert "no jobs yet" in result.stdout
