"""Every exception class the project defines, listed, counted against a budget, and each on its layer's one tree:
``bot.errors.FinetuneError`` in ``bot/``, ``runner.errors.RunnerError`` in ``runner/``, ``handlers.errors.CoreError``
in ``handlers/``. A class is worth having only where a caller catches it by type; anything else raises its parent
with a clear message. Read from the source (no import: the runner's trainer modules pull in heavy libraries), so a
new class fails here with its file and line, whether it stands on a bare built-in base or adds one past the budget.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("bot", "runner", "handlers")
ROOTS = {"bot": "FinetuneError", "runner": "RunnerError", "handlers": "CoreError"}
# Every exception class of bot/, runner/ and handlers/ together; lower it when a class goes, never raise it lightly.
BUDGET = 29
BUILT_IN = frozenset(
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
)
# A base that is neither ours nor built in (``aiohttp.ClientError``, ``websockets.WebSocketException``) is taken for
# an exception by its name.
FOREIGN_SUFFIXES = ("Error", "Exception", "Warning")


@dataclass(frozen=True, slots=True)
class Found:
    layer: str
    name: str
    path: str  # relative to the repository
    line: int
    bases: tuple[str, ...]  # each base's last name (``errors.FinetuneError`` -> ``FinetuneError``)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def classes(root: Path, layers: tuple[str, ...] = LAYERS) -> list[Found]:
    """Every class (nested ones too) of each layer's package under ``root``, with its bases."""
    found = []
    for layer in layers:
        for path in sorted((root / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    bases = tuple(name for base in node.bases if (name := _base_name(base)) is not None)
                    found.append(Found(layer, node.name, str(path.relative_to(root)), node.lineno, bases))
    return found


def exception_classes(found: list[Found]) -> list[Found]:
    """The classes among ``found`` whose bases lead to an exception: a built-in one, a foreign one, or one of ours."""
    ours = {item.name for item in found}
    exceptions: dict[str, Found] = {}
    changed = True
    while changed:
        changed = False
        for item in found:
            if item.name in exceptions:
                continue
            if any(
                base in BUILT_IN or base in exceptions or (base not in ours and base.endswith(FOREIGN_SUFFIXES))
                for base in item.bases
            ):
                exceptions[item.name] = item
                changed = True
    return sorted(exceptions.values(), key=lambda item: (item.layer, item.path, item.line))


def off_their_tree(exceptions: list[Found], roots: dict[str, str] = ROOTS) -> list[str]:
    """Each exception class that is not its layer's root and does not derive from it through the layer's own
    classes; and each root that is missing, stands on another class of ours, or is not alone in its layer."""
    by_layer: dict[str, dict[str, Found]] = {}
    for item in exceptions:
        by_layer.setdefault(item.layer, {})[item.name] = item
    strays = []
    for layer, root in roots.items():
        mine = by_layer.get(layer, {})
        if root not in mine:
            strays.append(f"{layer}: no root {root}")
            continue
        if not all(base in BUILT_IN for base in mine[root].bases):
            strays.append(f"{mine[root].where} {root}: a root stands on built-in bases alone")
        strays += [f"{item.where} {item.name}" for item in mine.values() if not _reaches(item.name, root, mine)]
    return strays


def _reaches(name: str, root: str, layer: dict[str, Found], seen: frozenset[str] = frozenset()) -> bool:
    """Whether ``name`` is ``root`` or derives from it through classes of the same layer."""
    if name == root:
        return True
    item = layer.get(name)
    seen = seen | {name}
    return item is not None and any(_reaches(base, root, layer, seen) for base in item.bases if base not in seen)


def tree_lines(exceptions: list[Found]) -> list[str]:
    return [f"{item.where:<45} {item.name}({', '.join(item.bases)})" for item in exceptions]


def test_every_exception_class_is_listed_and_within_the_budget() -> None:
    exceptions = exception_classes(classes(ROOT))
    listing = tree_lines(exceptions)
    print("\n".join(["", *listing, f"{len(exceptions)} exception classes, budget {BUDGET}"]))
    counts = {layer: sum(item.layer == layer for item in exceptions) for layer in LAYERS}
    assert len(exceptions) <= BUDGET, (
        f"{len(exceptions)} exception classes {counts}, over the budget of {BUDGET}: keep a class only where a caller "
        "catches it by type, raise its parent otherwise\n" + "\n".join(listing)
    )
    names = [item.name for item in exceptions]
    assert len(names) == len(set(names)), "two exception classes share a name: " + ", ".join(sorted(names))


def test_each_layer_has_one_root_and_every_exception_class_derives_from_it() -> None:
    strays = off_their_tree(exception_classes(classes(ROOT)))
    roots = ", ".join(f"{layer}: {root}" for layer, root in ROOTS.items())
    assert strays == [], f"put these on their layer's tree ({roots})"


def test_the_walk_finds_a_new_class_and_one_off_its_tree(tmp_path: Path) -> None:
    """The checks above can fail: a class added past the roots is counted, and one on a bare built-in base, or on a
    foreign one, or on another layer's root, is off its tree."""
    (tmp_path / "bot").mkdir()
    (tmp_path / "runner").mkdir()
    (tmp_path / "bot" / "errors.py").write_text(
        "class FinetuneError(Exception): ...\n"
        "class ChatError(FinetuneError): ...\n"
        "class Outside(ValueError): ...\n"
        "class Theirs(aiohttp.ClientError): ...\n"
        "class Crossed(RunnerError): ...\n"
        "class NotAnError: ...\n"
    )
    (tmp_path / "runner" / "errors.py").write_text(
        "class RunnerError(Exception): ...\n"
        "def run():\n"
        "    class _Signal(RunnerError): ...\n"
    )
    found = exception_classes(classes(tmp_path, ("bot", "runner")))
    named = ["FinetuneError", "ChatError", "Outside", "Theirs", "Crossed", "RunnerError", "_Signal"]
    assert [item.name for item in found] == named
    strays = off_their_tree(found, {"bot": "FinetuneError", "runner": "RunnerError"})
    assert [stray.split()[-1] for stray in strays] == ["Outside", "Theirs", "Crossed"]
    assert off_their_tree(found, {"bot": "FinetuneError", "runner": "Gone"}) == [
        *strays,
        "runner: no root Gone",
    ]


@pytest.mark.parametrize(("layer", "root"), sorted(ROOTS.items()))
def test_each_root_is_in_its_layers_errors_module(layer: str, root: str) -> None:
    """Where a reader looks for the tree: ``<layer>/errors.py``, its docstring drawing it."""
    [item] = [item for item in exception_classes(classes(ROOT, (layer,))) if item.name == root]
    assert item.where.startswith(f"{layer}/errors.py:")
