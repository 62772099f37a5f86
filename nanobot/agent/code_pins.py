"""What code a shell command would run, pinned: the fingerprint a saved approval holds, so the
approval stops applying when that code changes ("an approval approves code, not words").

`pin(command, workspace)` reads the files the command names and the configuration its tools
read from the working directory (the workspace), and returns their digests (`Pinned`), or
why the code cannot be pinned (`Unpinned`: such a command may be approved once, never saved).
Only what the agent can write matters: the workspace (HOME inside the sandbox is a private
folder of each call, the rest of the system is read-only there). What is pinned:

- every word (and `NAME=value` or `--opt=value` value) that names an existing file in the
  workspace, relative to it or absolute; a word that names a folder, a glob or uses a
  variable cannot be pinned;
- the program a command runs from the workspace (`./x`, `bin/x`) and the script an
  interpreter runs (`python3 tool.py`, `bash x.sh`, `node x.js`, `source x`): it must exist;
- `python3 -m mod`: the workspace's `mod.py` or `mod/__init__.py` and `mod/__main__.py`;
  for any Python: the `.py` files beside the script (its folder comes first on the import
  path) and the packages there, and `sitecustomize.py`, `usercustomize.py` and `*.pth` files
  anywhere in the workspace;
- the configuration a tool reads from the working directory, present or not (a file created
  later voids the rule): `git` (`.git/config`, `.git/config.worktree`, every file in
  `.git/hooks/`, `.git/info/attributes`, `.gitattributes`, `.gitmodules`, a `.git` file and
  the folder it names, and `.gitconfig`, `.config/git/config` and `.config/git/attributes`
  in case HOME is the workspace),
  `npm`/`npx`/`yarn`/`pnpm`/`node`/`bun` (`package.json`, `.npmrc`, `.yarnrc`,
  `.yarnrc.yml`, `.pnpmfile.cjs`), `make` (`Makefile`, `makefile`, `GNUmakefile`), and
  Python's packaging tools (`pyproject.toml`, `setup.cfg`, `setup.py`, `tox.ini`);
- tools that find and run code in the folder by themselves (`pytest`, `tox`, `nox`, `cargo`,
  `go`, test runners), and interpreters run from the workspace (`.venv/bin/python`: their
  installed packages are the agent's to change) cannot be pinned. Not followed: what a
  Makefile recipe or an npm script runs, and modules a Node script loads from
  `node_modules`.

Blocking (it reads files): call it in a thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from nanobot.agent._commands import simple_commands

__all__ = ["Pinned", "Unpinned", "changed", "pin"]

ABSENT: Final = "absent"
MAX_FILES: Final = 2_000  # files pinned for one command; more cannot be pinned
MAX_WALK: Final = 50_000  # entries of the workspace looked at for Python start-up files
_DIGEST_LENGTH: Final = 32
_GLOB: Final = re.compile(r"[*?\[]")
_ASSIGNMENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON: Final = re.compile(r"(python|pypy)[0-9.]*")
_SCRIPT_RUNNERS: Final = re.compile(
    r"(python|pypy|node|nodejs|bun|deno|perl|ruby|php|lua|luajit|tsx|ts-node)[0-9.]*"
    r"|sh|bash|dash|zsh|ksh|mksh|ash|fish|Rscript|\.|source"
)
# Options of interpreters whose next word is their value, not a script.
_VALUED: Final = frozenset({"-m", "-c", "-W", "-X", "-e", "-E", "-r", "-I", "--require"})
_FINDERS: Final = frozenset(
    {"pytest", "py.test", "tox", "nox", "cargo", "go", "jest", "vitest", "mocha", "rspec"}
    | {"phpunit", "ctest", "gradle", "gradlew", "mvn", "ant", "rake", "bundle", "just"}
)
_CONFIG: Final[Mapping[str, tuple[str, ...]]] = {
    "git": (
        ".git/config",
        ".git/config.worktree",
        ".git/info/attributes",
        ".gitattributes",
        ".gitmodules",
        # Read from HOME; counted in case HOME is the workspace (as it was before HOME in
        # the sandbox became a folder of each call's own).
        ".gitconfig",
        ".config/git/config",
        ".config/git/attributes",
    ),
    "npm": ("package.json", ".npmrc", ".yarnrc", ".yarnrc.yml", ".pnpmfile.cjs"),
    "make": ("Makefile", "makefile", "GNUmakefile"),
    "python": ("pyproject.toml", "setup.cfg", "setup.py", "tox.ini"),
}
_TOOLS: Final[Mapping[str, str]] = {
    "git": "git",
    **dict.fromkeys(("npm", "npx", "yarn", "pnpm", "node", "nodejs", "bun"), "npm"),
    **dict.fromkeys(("make", "gmake"), "make"),
    **dict.fromkeys(("pip", "pip3", "uv", "poetry", "pdm", "hatch", "pipx"), "python"),
}
_SKIPPED_DIRS: Final = frozenset({".git", "node_modules"})
_PYTHON_START: Final = frozenset({"sitecustomize.py", "usercustomize.py"})
_TRANSIENT: Final = ("/tmp/", "/var/tmp/", "/dev/shm/")  # private to each call: made in it


@dataclass(frozen=True, slots=True)
class Pinned:
    """The digests of the files a command's code depends on, by path (relative to the
    workspace), `ABSENT` for configuration that is not there."""

    files: Mapping[str, str]

    @property
    def text(self) -> str:
        """As stored with a rule: JSON, sorted."""
        return json.dumps(dict(sorted(self.files.items())), separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Unpinned:
    """The code cannot be pinned; `reason` says why, for the card."""

    reason: str


class _CannotPin(Exception):
    pass


def pin(command: str, workspace: Path) -> Pinned | Unpinned:
    """The fingerprint of the code `command` would run in `workspace` (its working
    directory), or why there is none. Never raises for any command; blocking."""
    commands = simple_commands(command)
    if commands is None:
        return Unpinned("it could not be parsed as a shell command")
    root = Path(os.path.realpath(workspace))
    files: dict[str, str] = {}
    try:
        for words in commands:
            for path in _paths(words, root):
                if len(files) >= MAX_FILES:
                    raise _CannotPin(f"it depends on more than {MAX_FILES} files")
                files.setdefault(_name(path, root), _digest(path))
    except _CannotPin as exc:
        return Unpinned(str(exc))
    except OSError as exc:
        return Unpinned(f"a file it names could not be read ({exc.strerror or exc})")
    return Pinned(files)


def changed(saved: str, now: str) -> str | None:
    """What differs between two fingerprints (`Pinned.text`), for the card ("tool.py
    changed"); None when they are the same. An unreadable or empty `saved` (a rule from
    before fingerprints) says so."""
    if saved == now:
        return None
    try:
        before, after = json.loads(saved), json.loads(now)
    except ValueError:
        return "it was saved before approvals recorded the code a command runs"
    if not isinstance(before, dict) or not isinstance(after, dict):
        return "it was saved before approvals recorded the code a command runs"
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path, ABSENT), after.get(path, ABSENT)
        if old == new:
            continue
        if old == ABSENT:
            return f"{path} was created"
        return f"{path} was removed" if new == ABSENT else f"{path} changed"
    return "the files it runs changed"


def _paths(words: list[str], root: Path) -> Iterator[Path]:
    """The files the simple command `words` depends on, config that is absent included."""
    start = 0
    while start < len(words) and _ASSIGNMENT.match(words[start]):
        start += 1
    names = [_basename(word) for word in words[start:]]
    for name in names:
        if name in _FINDERS:
            raise _CannotPin(f"{name} finds and runs code in the folder by itself")
    program = words[start] if start < len(words) else ""
    if "/" in program and _SCRIPT_RUNNERS.fullmatch(names[0]) and _inside(root / program, root):
        raise _CannotPin(
            f"it runs an interpreter from the workspace ({program}), whose installed packages"
            " can change"
        )
    for index, word in enumerate(words):
        value = _value(word)
        code = (index == start and "/" in word) or _runs_script(words, start, index)
        yield from _word(value, root, code=code)
    for tool in dict.fromkeys(_TOOLS[name] for name in names if name in _TOOLS):
        yield from _config(tool, root)
    for index, name in enumerate(names):
        if _PYTHON.fullmatch(name):
            yield from _python(words[start + index + 1 :], root)


def _value(word: str) -> str:
    if _ASSIGNMENT.match(word):
        return word.split("=", 1)[1]
    if word.startswith("-") and "=" in word:
        return word.split("=", 1)[1]
    return word


def _runs_script(words: list[str], start: int, index: int) -> bool:
    """Whether `words[index]` is the script an interpreter before it runs: the first word
    after it that is not an option (nor an option's value: `python3 -m site`)."""
    if words[index].startswith("-") or (index > start and words[index - 1] in _VALUED):
        return False
    for before in range(index - 1, start - 1, -1):
        if words[before].startswith("-"):
            continue
        return bool(_SCRIPT_RUNNERS.fullmatch(_basename(words[before])))
    return False


def _word(word: str, root: Path, *, code: bool) -> Iterator[Path]:
    if not word or word.startswith("~") or (word.startswith("-") and not code):
        return
    if "$" in word:
        raise _CannotPin(f"{word} is named through a variable, so what it is cannot be told")
    if _GLOB.search(word):
        raise _CannotPin(f"it names files by a pattern ({word})")
    if code and word.startswith(_TRANSIENT):
        raise _CannotPin(f"it runs {word}, which the command itself must make")
    path = root / word
    inside = _inside(path, root)
    if path.is_dir() and inside:
        raise _CannotPin(f"it names a folder ({word}), whose contents can change")
    if path.is_file() and (inside or code):
        yield path
    elif code and not path.exists():
        raise _CannotPin(f"it runs {word}, which does not exist yet")


def _config(tool: str, root: Path) -> Iterator[Path]:
    for name in _CONFIG[tool]:
        yield root / name
    if tool == "git":
        git = root / ".git"
        if git.is_file():  # a worktree's or submodule's pointer: its own folder counts too
            yield git
            git = _git_dir(git, root)
            yield from (git / name for name in ("config", "config.worktree", "commondir"))
        hooks = git / "hooks"
        if hooks.is_dir():
            yield from sorted(p for p in hooks.iterdir() if not p.is_dir())


def _git_dir(pointer: Path, root: Path) -> Path:
    """The folder a `.git` file points to (`gitdir: …`); one outside the workspace is the
    user's, not the agent's to write, but counts the same."""
    text = pointer.read_text(errors="replace").strip()
    if not text.startswith("gitdir:"):
        raise _CannotPin(".git is a file that names no git folder")
    target = Path(text[len("gitdir:") :].strip())
    return target if target.is_absolute() else root / target


def _python(args: list[str], root: Path) -> Iterator[Path]:
    """What a Python run from the workspace imports from it: the module of `-m`, the files
    beside the script (or the working directory), and the start-up files."""
    home = root
    for index, arg in enumerate(args):
        if arg == "-m" and index + 1 < len(args):
            yield from _module(args[index + 1], root)
            break
        if not arg.startswith("-"):
            script = root / arg
            home = script.parent if _inside(script, root) else root
            break
    if _inside(home, root) and home.is_dir():
        for entry in sorted(home.iterdir()):
            if entry.is_file() and entry.suffix in {".py", ".pth"}:
                yield entry
            elif (entry / "__init__.py").is_file():
                yield from _package(entry)
    yield from _start_up_files(root)


def _module(name: str, root: Path) -> Iterator[Path]:
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise _CannotPin(f"python -m {name}: not a module name")
    for depth in range(1, len(parts)):
        yield root.joinpath(*parts[:depth], "__init__.py")
    leaf = root.joinpath(*parts)
    if leaf.is_dir():
        yield leaf / "__init__.py"
        yield leaf / "__main__.py"
    else:
        yield leaf.with_name(f"{parts[-1]}.py")


def _package(folder: Path) -> Iterator[Path]:
    for top, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
        for name in sorted(names):
            if name.endswith(".py"):
                yield Path(top) / name


def _start_up_files(root: Path) -> Iterator[Path]:
    seen = 0
    for top, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
        seen += len(dirs) + len(names)
        if seen > MAX_WALK:
            raise _CannotPin(
                f"the workspace has more than {MAX_WALK} entries to look through for Python"
                " start-up files (.pth, sitecustomize.py)"
            )
        for name in sorted(names):
            if name in _PYTHON_START or name.endswith(".pth"):
                yield Path(top) / name


def _basename(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _inside(path: Path, root: Path) -> bool:
    real = Path(os.path.realpath(path))
    return real == root or root in real.parents or _lexically_inside(path, root)


def _lexically_inside(path: Path, root: Path) -> bool:
    normal = Path(os.path.normpath(path))
    return normal == root or root in normal.parents


def _name(path: Path, root: Path) -> str:
    normal = Path(os.path.normpath(path))
    try:
        return str(normal.relative_to(root))
    except ValueError:
        return str(normal)


def _digest(path: Path) -> str:
    """The file's content digest (a symbolic link's target counts too), or `ABSENT`."""
    if not os.path.lexists(path):
        return ABSENT
    digest = hashlib.sha256()
    if path.is_symlink():
        digest.update(f"link:{path.readlink()}\0".encode(errors="surrogateescape"))
    if path.is_dir():
        raise _CannotPin(f"{path.name} is a folder, whose contents can change")
    if not path.exists():
        return digest.hexdigest()[:_DIGEST_LENGTH]  # a dangling link: its target counts
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:_DIGEST_LENGTH]
