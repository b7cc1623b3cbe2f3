"""The dependency rules of DESIGN.md, checked on what each entry point actually loads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def loaded_after(module: str) -> set[str]:
    return loaded_by(f"import {module}")


def loaded_by(statements: str) -> set[str]:
    """The top-level packages a fresh interpreter holds after ``statements`` (one marked absent, ``None`` in
    ``sys.modules``, is not loaded)."""
    listed = "' '.join(sorted(name.split('.')[0] for name, module in sys.modules.items() if module is not None))"
    code = f"import sys\n{statements}\nprint({listed})"
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
    (torch, transformers and peft, 3 s of CPU), which the ranks import, without the libraries installed beside it
    that the tiny run never uses (ms-swift's ``datasets`` and ``scipy``: a second of CPU)."""
    heavy = {"torch", "transformers", "peft"}
    assert not loaded_after("runner.hf.tiny") & heavy
    training = loaded_by("from runner.hf.tiny import load_training\nload_training()")
    assert training >= heavy
    assert not training & {"datasets", "scipy", "pandas", "pyarrow"}


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


# -- the core's own arrows: no cycle, no sibling's private name, a runner without the spot authority -------------


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(*folders: str) -> dict[str, Path]:
    return {module_name(path): path for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))}


def imported_from(module: str, node: ast.ImportFrom) -> str:
    """The module an ``ImportFrom`` names, relative ones resolved against ``module`` (a package's ``__init__`` is
    named for the package, so ``from . import x`` there means the package itself)."""
    if node.level == 0:
        return node.module or ""
    is_package = (ROOT / Path(*module.split("."))).is_dir()
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def import_edges(module: str, source: str, known: set[str]) -> set[str]:
    """The project modules ``module`` imports, wherever the import stands (a function's, ``TYPE_CHECKING``'s): ``from
    package import name`` is an edge to ``package.name`` where that is a module, else to ``package``."""
    edges: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(module, node)
            for alias in node.names:
                edges.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {edge for edge in edges if edge in known and edge != module}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            target = next(edges, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, set())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def handlers_graph() -> dict[str, set[str]]:
    modules = project_modules("handlers")
    return {name: import_edges(name, path.read_text(), set(modules)) for name, path in modules.items()}


def private_imports(module: str, source: str, known: set[str]) -> set[str]:
    """The private names (``_x``, not dunders) ``module`` takes from another project module: ``from m import _x``,
    or ``m._x`` on a module it imported by name."""
    found: set[str] = set()
    aliases: dict[str, str] = {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = imported_from(module, node)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif base in known and alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.add(f"{base}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
            continue
        if node.value.id in aliases and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.add(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_the_cycle_and_private_name_checks_can_fail() -> None:
    """What the rules below look for is found: a cycle of three, and a sibling's private name taken either way."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
    known = {"handlers.decide.builders", "handlers.decide.gangs", "handlers.decide", "handlers"}
    source = (
        "from handlers.decide.builders import _note, make\n"
        "from handlers.decide import gangs\n"
        "import handlers.decide.gangs as g\n"
        "def f():\n"
        "    return gangs._node_lost, g._move, gangs.cloud, g.__name__\n"
    )
    taken = private_imports("handlers.decide.inputs", source, known)
    gangs = {"handlers.decide.gangs._node_lost", "handlers.decide.gangs._move"}
    assert taken == {"handlers.decide.builders._note", *gangs}
    relative = import_edges("handlers.decide.inputs", "from . import gangs\nfrom .builders import make\n", known)
    assert relative == {"handlers.decide.gangs", "handlers.decide.builders"}


def test_no_import_cycle_inside_handlers() -> None:
    """Straight arrows in the core (one node's decisions and a gang's, the job and its Change, the notes and the spot
    policy all once went round in circles): every import of handlers/**.py, a lazy one too, points down."""
    graph = handlers_graph()
    assert "handlers.decide.gangs" in graph["handlers.decide.dispatch"]  # the graph sees the package's own arrows
    assert import_cycles(graph) == []


def test_no_module_takes_a_private_name_of_another() -> None:
    """What a module shares is public (no underscore); what is private stays in its module."""
    modules = project_modules("handlers", "bot", "runner", "fakes")
    known = set(modules)
    taken = {name: private_imports(name, path.read_text(), known) for name, path in modules.items()}
    assert {name: names for name, names in taken.items() if names} == {}


RUNNER_HANDLERS_BUDGET = 10


@pytest.mark.scenario
def test_the_runner_loads_no_spot_policy_and_few_handlers_modules() -> None:
    """The agent on every GPU host needs what it shares with the bot (the spec, the report schema, signing, the
    attempt's key, backoff), not the bot's decisions: importing every module of the runner package (the trainer's
    side, runner.hf and runner.swift, aside) loads no ``handlers.spot`` module and at most ten of ``handlers``."""
    code = (
        "import importlib, pkgutil, sys, runner\n"
        "for info in pkgutil.walk_packages(runner.__path__, 'runner.'):\n"
        "    if not info.name.startswith(('runner.hf', 'runner.swift')):\n"
        "        importlib.import_module(info.name)\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    loaded = set(out.stdout.split())
    assert {"runner.agent", "runner.reports.sns", "runner.storage.s3", "runner.notices.aws"} <= loaded  # all of it
    handlers = {name for name in loaded if name.startswith("handlers.")}
    assert {name for name in handlers if name.startswith("handlers.spot")} == set()
    assert {"handlers.spec", "handlers.reports"} <= handlers
    assert len(handlers) <= RUNNER_HANDLERS_BUDGET, sorted(handlers)
