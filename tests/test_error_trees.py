"""Every exception class the project defines sits on its layer's tree: ``bot.errors.FinetuneError`` in ``bot/``,
``runner.errors.RunnerError`` in ``runner/``, and the pure core's few input errors in ``handlers/``. Read from the
source (no import: the runner's trainer modules pull in heavy libraries), so a new class on a bare built-in base
fails here with its file and line.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILT_IN = frozenset(
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
)
# Classes allowed to stand on built-in bases alone, and why.
ALLOWED: dict[str, dict[str, str]] = {
    "bot": {
        "FinetuneError": "the root",
        "HandBack": "a handler's signal to the bus (hand the message back), never an error a caller sees",
    },
    "runner": {
        "RunnerError": "the root",
    },
    # The core imports nothing of the bot: its input errors are ValueErrors, as pydantic's validators and the
    # parsers' ``except ValueError`` expect.
    "handlers": {
        "CoreError": "the root",
    },
}


def bare_exception_classes(package: str) -> dict[str, str]:
    """Class name -> ``file:line`` for each class in ``package`` whose every base is a built-in exception."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef) or not node.bases:
                continue
            bases = [base.id if isinstance(base, ast.Name) else None for base in node.bases]
            if all(base in BUILT_IN for base in bases):
                found[node.name] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_every_exception_class_is_on_its_layers_tree(package: str) -> None:
    found = bare_exception_classes(package)
    strays = {name: where for name, where in found.items() if name not in ALLOWED[package]}
    assert not strays, f"put these on {package}'s error tree (or say here why not): {strays}"
    assert set(found) == set(ALLOWED[package]), "an allowed class is gone: take it off the list"
