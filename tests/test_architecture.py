"""The import rules of DESIGN.md §1: ports and adapters, one composition root."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nanobot"

# module (or package) -> nanobot modules it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "nanobot.agent.runner": ("nanobot.store", "nanobot.channels", "nanobot.config", "nanobot.app"),
    "nanobot.agent.run": ("nanobot.store", "nanobot.channels", "nanobot.config", "nanobot.app"),
    "nanobot.agent": ("nanobot.channels", "nanobot.config", "nanobot.app", "nanobot.cli"),
    "nanobot.tools": (
        "nanobot.agent",
        "nanobot.channels",
        "nanobot.store",
        "nanobot.config",
        "nanobot.app",
    ),
    "nanobot.providers": (
        "nanobot.agent",
        "nanobot.tools",
        "nanobot.store",
        "nanobot.channels",
        "nanobot.config",
        "nanobot.app",
    ),
    "nanobot.store": (
        "nanobot.agent",
        "nanobot.tools",
        "nanobot.providers",
        "nanobot.channels",
        "nanobot.config",
        "nanobot.app",
    ),
    "nanobot.channels": (
        "nanobot.store",
        "nanobot.providers",
        "nanobot.config",
        "nanobot.app",
        "nanobot.tools",
    ),
    "nanobot.config": (
        "nanobot.agent",
        "nanobot.tools",
        "nanobot.store",
        "nanobot.providers",
        "nanobot.channels",
        "nanobot.app",
    ),
}
ONLY_THE_PROVIDER_IMPORTS = {"litellm": "nanobot.providers.litellm_provider"}


def modules() -> dict[str, set[str]]:
    """Every nanobot module and the absolute names it imports."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module)
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
        found[name] = imported
    return found


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("owner", sorted(FORBIDDEN))
def test_layers_import_only_what_they_may(owner: str) -> None:
    broken = [
        f"{module} imports {name}"
        for module, imported in modules().items()
        if within(module, owner)
        for name in imported
        for banned in FORBIDDEN[owner]
        if within(name, banned)
    ]
    assert broken == []


def test_only_the_composition_root_and_cli_import_the_app() -> None:
    importers = {m for m, imported in modules().items() if "nanobot.app" in imported}
    assert importers <= {"nanobot.cli"}


def test_heavy_libraries_have_one_home() -> None:
    for library, home in ONLY_THE_PROVIDER_IMPORTS.items():
        importers = {
            m for m, imported in modules().items() if any(within(n, library) for n in imported)
        }
        assert importers == {home}
