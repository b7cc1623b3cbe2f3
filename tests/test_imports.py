"""The dependency rules of DESIGN.md, checked on what each entry point actually loads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def loaded_after(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted(name.split('.')[0] for name in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(out.stdout.split())


def imported_packages(source: str) -> set[str]:
    """Every top-level package the source imports, wherever the import stands (a function's lazy import too), and
    what ``importlib.import_module`` / ``__import__`` is asked for by name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.add(node.args[0].value.split(".")[0])
    return found


def forbidden_imports(folder: str, forbidden: set[str]) -> dict[str, set[str]]:
    """The files under ``folder`` that import one of ``forbidden``, with what they import of it."""
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        bad = imported_packages(path.read_text()) & forbidden
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_the_import_rule_sees_every_kind_of_import() -> None:
    """The rules below can fail: each way of importing a package is seen, relative imports are the package's own."""
    source = (
        "import os, runner.storage\n"
        "from . import sibling\n"
        "def lazy():\n"
        "    from tests.chaos import Cluster\n"
        "    importlib.import_module('bench.chaos')\n"
        "    return __import__('handlers.spec')\n"
    )
    assert imported_packages(source) == {"os", "runner", "tests", "bench", "handlers"}


@pytest.mark.scenario
def test_the_bot_never_imports_the_runner() -> None:
    """What both must agree on lives in handlers (DESIGN.md): the bot writes its own OSS objects, for one."""
    assert forbidden_imports("bot", {"runner"}) == {}
    assert not loaded_after("bot.service, bot.cli, bot.cloud.aliyun.provider, bot.cloud.aws.provider") & {"runner"}


def test_the_runner_never_imports_the_bot() -> None:
    assert forbidden_imports("runner", {"bot"}) == {}


def test_bench_never_imports_the_tests() -> None:
    """What bench shares with the tests (the local fakes, the harnesses) is the ``fakes`` package."""
    assert forbidden_imports("bench", {"tests"}) == {}
    assert forbidden_imports("fakes", {"tests"}) == {}


@pytest.mark.scenario
def test_the_runner_agent_stays_light() -> None:
    loaded = loaded_after("runner.cli")
    assert not loaded & {"torch", "transformers", "peft", "slack_bolt", "slack_sdk", "dingtalk_stream", "redis", "bot"}


def test_numpy_and_the_plan_are_the_benchs() -> None:
    """``deadline-aware-plan`` and its numpy table are a bench policy (``bench/spot_plan.py``): nothing of the product
    imports numpy by name or anything of the bench (the bot's charts reach numpy only through matplotlib)."""
    for folder in ("handlers", "bot", "runner", "fakes"):
        assert forbidden_imports(folder, {"numpy", "bench"}) == {}, folder


@pytest.mark.scenario
def test_the_spot_authority_and_the_simulator_load_no_numpy() -> None:
    """What ``finetune-bot simulate`` and the live decision load has no numpy; the bench's plan does (so the check
    sees it where it is)."""
    assert "numpy" not in loaded_after("handlers.spot, handlers.decide, bot.simulate")
    assert "numpy" not in loaded_after("runner.cli")
    assert "numpy" in loaded_after("bench.spot_plan")


@pytest.mark.scenario
def test_the_aws_sdk_and_the_cipher_load_only_for_a_runner_that_uses_them() -> None:
    """Half the runner's start-up: a runner on a directory store with HTTP reports (the local cloud's) never imports
    botocore or cryptography; an S3 store or an SNS target loads the SDK (a sealed key, the cipher: its tests)."""
    sdk = {"aiobotocore", "botocore", "cryptography"}
    assert not loaded_after("runner.cli") & sdk
    assert loaded_after("runner.storage.s3") >= {"aiobotocore", "botocore"}
    assert loaded_after("runner.reports.sns") >= {"aiobotocore", "botocore"}


@pytest.mark.scenario
def test_the_torchrun_launcher_of_the_tiny_run_loads_no_transformers() -> None:
    """``runner.hf.tiny --processes N`` only supervises its ranks: it imports the command line, not the training
    (torch, transformers and peft, 3 s of CPU), which the ranks import."""
    heavy = {"torch", "transformers", "peft"}
    assert not loaded_after("runner.hf.tiny") & heavy
    assert loaded_after("runner.hf.tiny_training") >= heavy


@pytest.mark.scenario
def test_handlers_need_no_io_library() -> None:
    loaded = loaded_after(
        "handlers.decide, handlers.commands, handlers.aws_events, handlers.spot, handlers.spot.zones, "
        "handlers.aliyun_events"
    )
    assert not loaded & {"aiohttp", "boto3", "botocore", "aiobotocore", "redis", "slack_bolt", "bot", "runner"}


@pytest.mark.scenario
def test_the_bot_does_not_load_torch() -> None:
    assert not loaded_after("bot.service") & {"torch", "transformers", "peft"}


@pytest.mark.scenario
def test_alibabas_sdks_load_only_with_the_alibaba_provider() -> None:
    """They take about a second to import: a bot on another cloud (or the console chat) never pays for it."""
    sdks = {"alibabacloud_ecs20140526", "alibabacloud_ess20220222", "alibabacloud_tea_openapi"}
    assert not loaded_after("bot.service") & sdks
    assert loaded_after("bot.cloud.aliyun.provider") >= sdks


@pytest.mark.scenario
def test_matplotlib_loads_with_the_first_chart_not_with_the_bot() -> None:
    """Drawing a chart imports it (a second or so, and memory): a bot that never draws one never pays for it."""
    assert "matplotlib" not in loaded_after("bot.service")
    assert "matplotlib" not in loaded_after("bot.chat.slack.deliverer")
    assert "matplotlib" not in loaded_after("bot.chat.dingtalk.deliverer")
    assert "matplotlib" not in loaded_after("bot.charts.render")  # the module itself imports it when it draws
