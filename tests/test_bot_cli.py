"""The bot's command line as an operator uses it: serve until SIGTERM, a console chat on stdin."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.servers import free_port, wait_http


def bot_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env.update(FINETUNE_STATE_DIR=str(tmp_path / "state"), FINETUNE_LOG_LEVEL="INFO", **extra)
    return env


def test_serve_answers_health_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "serve"],
        env=bot_env(tmp_path, FINETUNE_HTTP_PORT=str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert 'finetune_jobs{state="RUNNING"} 0' in response.read().decode()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    assert "no permission rules configured: everyone may use every command" in output
    assert "Traceback" not in output
    assert not _valkey_serving(tmp_path / "state" / "redis")  # the embedded server went down with the bot


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
    assert "/finetune start <recipe> [key=value …]" in result.stdout
    assert "unknown recipe 'llama-70b'; known recipes: deepseek-7b, tiny" in result.stdout
    assert "no job ft-zzzz" in result.stdout
    assert "no jobs yet" in result.stdout


def test_a_bad_config_file_is_one_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "bot.yaml"
    config.write_text("policy:\n  max_concurrent_jobs: 0\n")
    result = subprocess.run(
        [sys.executable, "-m", "bot.cli", "serve"],
        env=bot_env(tmp_path, FINETUNE_CONFIG=str(config), FINETUNE_HTTP_PORT="0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "policy.max_concurrent_jobs" in result.stderr and "Traceback" not in result.stderr


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
