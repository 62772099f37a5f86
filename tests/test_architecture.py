"""The import rules of DESIGN.md §1, derived from one ordered list of layers.

A module may import modules of its own unit (a package or a module named in `LAYERS`) and of
any unit in a lower layer; units of one layer know nothing of each other. Every module of
`nanobot/` must belong to a unit. On top of the order, a few sideways rules from DESIGN.md:
channels know only the bus (and the foundation); the runner knows only providers and tools;
only the composition root, the CLI and logging read the config tree. Imports anywhere in a
file count, inside functions and `TYPE_CHECKING` blocks too: a lazy import is still a
dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nanobot"

# Lowest first. A new module belongs in one of these, or the test fails until it does.
LAYERS: tuple[tuple[str, ...], ...] = (
    # The foundation (with the two layers after it): anything may use them.
    (
        "nanobot",
        "nanobot.errors",
        "nanobot.durations",
        "nanobot.proxies",
        "nanobot.workspace",
        "nanobot.sizes",
        "nanobot.allowed_hosts",  # tools.exec.allow_hosts entries: the config and the proxy
        "nanobot.outage",  # one policy for a failing store: the gate, cron, channels, …
    ),
    # people: who a message is from and their folder (pure; the inbox uses it too)
    ("nanobot.tasks", "nanobot.people"),
    ("nanobot.lanes",),  # per-key lanes on the owned task set (issue 14 item 3)
    ("nanobot.reserve",),  # the disk reserve, kept by the store and watched by exec
    ("nanobot.config",),
    ("nanobot.log",),  # reads secrets out of the config tree
    ("nanobot.bus",),
    ("nanobot.cron",),  # vocabulary, schedule math, the service; storage through a port
    ("nanobot.recall",),  # memory search: words, hits, ranking; the index through a port
    ("nanobot.store", "nanobot.providers", "nanobot.tools"),
    ("nanobot.media",),  # what arrives as files: voice notes heard, documents read
    ("nanobot.agent", "nanobot.channels"),
    # cluster: the members (membership, agreement, roster), the roles one member at a time
    # plays, and how the work is shared out
    ("nanobot.gate", "nanobot.cluster", "nanobot.mcp"),  # mcp: the MCP servers' tools
    ("nanobot.gateway", "nanobot.heartbeat"),
    ("nanobot.app", "nanobot.manage"),
    ("nanobot.launch",),  # ask, chat, serve: each builds its parts through the app
    ("nanobot.cli",),
    ("nanobot.__main__",),
)
FOUNDATION: tuple[str, ...] = LAYERS[0] + LAYERS[1] + LAYERS[2]  # with the task set and lanes

# Modules (and everything under them) that may import, beyond their own unit and the
# foundation, only what is listed.
KNOWS_ONLY: dict[str, tuple[str, ...]] = {
    "nanobot.channels": ("nanobot.bus",),
    "nanobot.agent.runner": ("nanobot.agent.run", "nanobot.providers", "nanobot.tools"),
    "nanobot.agent.run": ("nanobot.providers",),
}
# Modules that only the listed modules may import.
IMPORTED_ONLY_BY: dict[str, frozenset[str]] = {
    "nanobot.config": frozenset(
        {
            "nanobot.log",
            "nanobot.cluster.agreement",
            "nanobot.app",
            "nanobot.manage",
            "nanobot.launch",
            "nanobot.cli",
        }
    ),
    "nanobot.app": frozenset({"nanobot.launch", "nanobot.cli"}),
}
# Third-party libraries with exactly one home.
ONLY_HOME: dict[str, str] = {"litellm": "nanobot.providers.litellm_provider"}

# Known breaches, each (importer, imported unit): none now. An entry goes when it is fixed
# (`test_known_exceptions_are_still_needed` says so).
KNOWN_EXCEPTIONS: frozenset[tuple[str, str]] = frozenset()


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, name: str) -> set[str]:
    """Every absolute name `path` imports, anywhere in the file; `from x import y` gives
    both `x` and `x.y` (y may be a submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def owning_module(name: str, known: Iterable[str]) -> str | None:
    """The longest known module that `name` is (or is an attribute of)."""
    candidates = [module for module in known if within(name, module)]
    return max(candidates, key=len) if candidates else None


def unit_of(module: str) -> str | None:
    """The unit of LAYERS a module belongs to; the root package holds only itself."""
    units = [
        unit
        for layer in LAYERS
        for unit in layer
        if module == unit or (unit != "nanobot" and within(module, unit))
    ]
    return max(units, key=len) if units else None


def layer_of(unit: str) -> int:
    return next(index for index, layer in enumerate(LAYERS) if unit in layer)


def graph() -> dict[str, set[str]]:
    """Every nanobot module and the nanobot modules it imports (not itself)."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets = {owning_module(n, paths) for n in imported_names(path, name)}
        edges[name] = {target for target in targets if target is not None and target != name}
    return edges


def third_party(library: str) -> set[str]:
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        if any(within(imported, library) for imported in imported_names(path, name)):
            importers.add(name)
    return importers


def breaches(edges: Mapping[str, Iterable[str]]) -> list[str]:
    """Every import in `edges` that the layer order or a sideways rule forbids."""
    found: list[str] = []
    for module, targets in edges.items():
        unit = unit_of(module)
        if unit is None:
            continue  # test_every_module_has_a_layer reports it
        for target in sorted(targets):
            other = unit_of(target)
            if other is None or other == unit:
                continue
            if layer_of(other) >= layer_of(unit):
                found.append(f"{module} imports {target}: {other} is not below {unit}")
            for owner, allowed in KNOWS_ONLY.items():
                if (
                    within(module, owner)
                    and other not in FOUNDATION
                    and not any(within(target, ok) for ok in allowed)
                ):
                    found.append(f"{module} imports {target}: {owner} knows only {allowed}")
    for module, targets in edges.items():
        for target in targets:
            for guarded, importers in IMPORTED_ONLY_BY.items():
                if within(target, guarded) and not any(
                    within(module, ok) for ok in importers | {guarded}
                ):
                    found.append(f"{module} imports {target}: only {sorted(importers)} may")
    return sorted(set(found))


def excused(breach: str) -> bool:
    return any(
        breach.startswith(f"{module} imports {unit}.")
        or breach.startswith(f"{module} imports {unit}:")
        for module, unit in KNOWN_EXCEPTIONS
    )


def test_every_module_has_a_layer() -> None:
    assert sorted(module for module in graph() if unit_of(module) is None) == []


def test_layers_do_not_repeat_a_unit() -> None:
    units = [unit for layer in LAYERS for unit in layer]
    assert len(units) == len(set(units))


def test_imports_follow_the_layers_and_the_sideways_rules() -> None:
    assert [breach for breach in breaches(graph()) if not excused(breach)] == []


def test_known_exceptions_are_still_needed() -> None:
    found = breaches(graph())
    for module, unit in sorted(KNOWN_EXCEPTIONS):
        assert any(excused(b) and b.startswith(f"{module} imports {unit}") for b in found), (
            f"{module} no longer imports {unit}: remove it from KNOWN_EXCEPTIONS"
        )


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        # cron and store importing each other: the store may use the cron vocabulary only.
        (
            {"nanobot.cron.jobs": {"nanobot.store.cron"}, "nanobot.store.cron": {"nanobot.cron"}},
            [
                "nanobot.cron.jobs imports nanobot.store.cron:"
                " nanobot.store is not below nanobot.cron"
            ],
        ),
        # A channel reaching into the agent (same layer) or the store (lower, but not the bus).
        (
            {"nanobot.channels.discord": {"nanobot.agent.loop", "nanobot.store.journal"}},
            [
                "nanobot.channels.discord imports nanobot.agent.loop:"
                " nanobot.agent is not below nanobot.channels",
                "nanobot.channels.discord imports nanobot.agent.loop:"
                " nanobot.channels knows only ('nanobot.bus',)",
                "nanobot.channels.discord imports nanobot.store.journal:"
                " nanobot.channels knows only ('nanobot.bus',)",
            ],
        ),
        # The runner reaching for the store; a tool reading the config.
        (
            {
                "nanobot.agent.runner": {"nanobot.store.sessions"},
                "nanobot.tools.web": {"nanobot.config"},
            },
            [
                "nanobot.agent.runner imports nanobot.store.sessions: nanobot.agent.runner knows"
                " only ('nanobot.agent.run', 'nanobot.providers', 'nanobot.tools')",
                "nanobot.tools.web imports nanobot.config: only ['nanobot.app', 'nanobot.cli',"
                " 'nanobot.cluster.agreement', 'nanobot.launch', 'nanobot.log', 'nanobot.manage']"
                " may",
            ],
        ),
        # Siblings of one layer, and anything but the CLI importing the app.
        (
            {"nanobot.providers.base": {"nanobot.tools.base"}, "nanobot.manage": {"nanobot.app"}},
            [
                "nanobot.manage imports nanobot.app: nanobot.app is not below nanobot.manage",
                "nanobot.manage imports nanobot.app: only ['nanobot.cli', 'nanobot.launch'] may",
                "nanobot.providers.base imports nanobot.tools.base:"
                " nanobot.tools is not below nanobot.providers",
            ],
        ),
    ],
)
def test_the_rules_catch_what_they_are_for(edges: dict[str, set[str]], expected: list[str]) -> None:
    assert breaches(edges) == expected


def test_imports_inside_functions_count(tmp_path: Path) -> None:
    source = tmp_path / "nanobot" / "channels" / "x.py"
    source.parent.mkdir(parents=True)
    source.write_text("def f():\n    from ..agent import loop\n    import nanobot.store\n")
    assert imported_names(source, "nanobot.channels.x") >= {
        "nanobot.agent",
        "nanobot.agent.loop",
        "nanobot.store",
    }


def test_heavy_libraries_have_one_home() -> None:
    for library, home in ONLY_HOME.items():
        assert third_party(library) == {home}
