"""Skills: instructions for particular tasks, one folder each under `workspace/skills/`.

A skill is `skills/<folder>/SKILL.md`: YAML front matter, then markdown the model reads when
the task comes up::

    ---
    name: github                # default: the folder name
    description: Issues, pull requests and CI runs with the gh CLI.
    requires: {bins: [gh], env: [GH_TOKEN]}
    always: false               # true: the body is part of every system prompt
    ---
    Use `gh` through `exec` ...

The system prompt lists every skill (name, description, path), marks the ones whose
requirements are not met, and inlines the bodies of available `always` skills.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from loguru import logger

from nanobot.agent._files import FileCache, Version, same, size, version
from nanobot.agent.prompt_budget import Cut, PromptBudget, warning
from nanobot.workspace import ConfinementError, Workspace

SKILLS_DIR = "skills"
SKILL_FILE = "SKILL.md"

# The front matter block: a first line of `---`, then YAML up to a line of `---` or `...`.
_FRONT_MATTER = re.compile(
    r"\A---[ \t]*\r?\n(.*?)^(?:---|\.\.\.)[ \t]*\r?(?:\n|\Z)", re.DOTALL | re.M
)


@dataclass(frozen=True, slots=True)
class Skill:
    """A skill as the model sees it.

    `path` is the SKILL.md file; `body` the markdown after the front matter. `missing` lists
    unmet requirements as `"bin:<name>"` and `"env:<NAME>"`; `error` says why the file could
    not be understood (its other fields are then defaults). Only an `available` skill is used.
    """

    name: str
    description: str
    path: Path
    always: bool
    missing: tuple[str, ...]
    body: str
    error: str | None = None

    @property
    def available(self) -> bool:
        return not self.missing and self.error is None


@dataclass(frozen=True, slots=True)
class _Definition:
    """What a SKILL.md says. Whether its requirements are met is decided later: that depends
    on the environment, not on the file."""

    name: str
    description: str
    always: bool
    bins: tuple[str, ...]
    env: tuple[str, ...]
    body: str
    error: str | None = None


class _InvalidFrontMatter(ValueError):
    pass


class Skills:
    """The skills of a workspace, re-read only when their files change.

    `env` is the environment requirements are checked against (default: `os.environ`): a
    required variable must be set and non-empty, a required binary must be on its `PATH`.
    Lookups of binaries are cached until `PATH` changes.
    """

    def __init__(
        self,
        workspace: Path,
        env: Mapping[str, str] | None = None,
        *,
        budget: PromptBudget | None = None,
    ) -> None:
        """`budget` bounds each `always` skill's body in the prompt (`file_chars`), as it
        does the prompt files: only as much of each SKILL.md is read as it could show."""
        self._workspace = workspace
        self._dir = workspace / SKILLS_DIR
        self._env: Mapping[str, str] = os.environ if env is None else env
        self._confined = Workspace(workspace)
        self._budget = budget if budget is not None else PromptBudget()
        self._files: FileCache[_Definition] = FileCache(
            _parse, workspace, max_bytes=self._budget.read_bytes()
        )
        self._warned: frozenset[Cut] = frozenset()
        self._dir_version: Version | None = None
        self._skill_files: tuple[Path, ...] = ()
        self._which_path: str | None = None
        self._which: dict[str, bool] = {}
        self._key: object = None
        self._definitions: tuple[_Definition | None, ...] = ()
        self._skills: tuple[Skill, ...] = ()
        self._rendered_of: tuple[Skill, ...] | None = None
        self._rendered = ("", "")

    @property
    def directory(self) -> Path:
        return self._dir

    def all(self) -> tuple[Skill, ...]:
        """Every skill, sorted by name then path. Returns the same object while no skill file,
        the folder list, `PATH` or a required environment variable changed."""
        files = self._list()
        definitions = tuple(self._files.get(path) for path in files)
        path_var = self._env.get("PATH", os.defpath)
        key = (files, path_var, self._env_key(definitions))
        if key == self._key and same(definitions, self._definitions):
            return self._skills
        if path_var != self._which_path:
            self._which_path, self._which = path_var, {}
        skills = tuple(
            sorted(
                (
                    self._skill(path, definition)
                    for path, definition in zip(files, definitions, strict=True)
                    if definition is not None
                ),
                key=lambda skill: (skill.name, str(skill.path)),
            )
        )
        self._key, self._definitions = key, definitions
        if skills != self._skills:
            self._skills = skills
        return self._skills

    def prompt_parts(self) -> tuple[str, str]:
        """`(summary, always)` from one look at the files: one line per skill for the model,
        `- name — description — path` with `(unavailable: …)` when a requirement is missing
        ("" when there are no skills); and the bodies of the available `always` skills, each
        under a heading naming it. The same string objects while nothing changed."""
        skills = self.all()
        if skills is not self._rendered_of:
            summary = "\n".join(self._summary_line(skill) for skill in skills)
            bodies: list[str] = []
            cuts: list[Cut] = []
            for skill in skills:
                if skill.always and skill.available and skill.body:
                    where = self._relative(skill.path)
                    # A skill the agent wrote can grow as a memory file can: same bound.
                    body, cut = self._budget.fit(
                        where, skill.body, self._budget.file_chars, size(skill.path)
                    )
                    bodies.append(f"## Skill {skill.name} ({where})\n\n{body}")
                    cuts += [cut] if cut is not None else []
            if not set(cuts) <= self._warned and (line := warning(cuts, self._budget)):
                logger.warning(line)
            self._warned = frozenset(cuts)
            self._rendered_of, self._rendered = skills, (summary, "\n\n".join(bodies))
        return self._rendered

    def _list(self) -> tuple[Path, ...]:
        # The folder's mtime changes when a skill folder is added, removed or renamed; a
        # SKILL.md appearing inside an existing folder is caught by the per-file stat().
        current = version(self._dir)
        if current != self._dir_version:
            self._dir_version = current
            self._skill_files = tuple(self._dir / name / SKILL_FILE for name in self._folders())
        return self._skill_files

    def _folders(self) -> list[str]:
        """The names of the folders in `skills/`, listed without leaving the workspace (each
        one's SKILL.md is read confined too, by the file cache)."""
        try:
            fd = self._confined.open_dir(SKILLS_DIR)
        except ConfinementError as exc:  # logged once per version of the folder
            logger.warning("Ignoring {}: it {}", self._dir, exc.reason)
            return []
        except OSError:
            return []
        try:
            with os.scandir(fd) as scan:
                return sorted(entry.name for entry in scan if entry.is_dir())
        finally:
            os.close(fd)

    def _env_key(self, definitions: tuple[_Definition | None, ...]) -> tuple[tuple[str, bool], ...]:
        return tuple(
            (name, bool(self._env.get(name)))
            for definition in definitions
            if definition is not None
            for name in definition.env
        )

    def _skill(self, path: Path, definition: _Definition) -> Skill:
        missing = [f"bin:{name}" for name in definition.bins if not self._has_bin(name)]
        missing += [f"env:{name}" for name in definition.env if not self._env.get(name)]
        return Skill(
            name=definition.name,
            description=definition.description,
            path=path,
            always=definition.always,
            missing=tuple(missing),
            body=definition.body,
            error=definition.error,
        )

    def _has_bin(self, name: str) -> bool:
        found = self._which.get(name)
        if found is None:
            found = shutil.which(name, path=self._which_path) is not None
            self._which[name] = found
        return found

    def _summary_line(self, skill: Skill) -> str:
        description = " ".join(skill.description.split())
        fields = [skill.name, description, self._relative(skill.path)]
        line = "- " + " — ".join(field for field in fields if field)
        if skill.error is not None:
            return f"{line} (unavailable: {skill.error})"
        if skill.missing:
            missing = ", ".join(item.replace(":", " ", 1) for item in skill.missing)
            return f"{line} (unavailable: missing {missing})"
        return f"{line} (always loaded, below)" if skill.always and skill.body else line

    def _relative(self, path: Path) -> str:
        return path.relative_to(self._workspace).as_posix()


def _parse(path: Path, text: str) -> _Definition:
    folder = path.parent.name
    try:
        meta, body = _split(text)
        return _define(folder, meta, body)
    except _InvalidFrontMatter as exc:
        # FileCache parses each version of a file once, so this is logged once per edit.
        logger.warning("Skill {} has invalid front matter: {}", path, exc)
        return _Definition(folder, "", False, (), (), "", f"invalid front matter: {exc}")


def _split(text: str) -> tuple[dict[str, object], str]:
    """The front matter mapping and the body; no front matter at all is an empty mapping."""
    text = text.removeprefix("\ufeff")
    if text.split("\n", 1)[0].strip() != "---":
        return {}, text.strip()
    match = _FRONT_MATTER.match(text)
    if match is None:
        raise _InvalidFrontMatter("no closing '---' line")
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.MarkedYAMLError as exc:
        where = f" (line {exc.problem_mark.line + 2})" if exc.problem_mark else ""
        raise _InvalidFrontMatter(f"{exc.problem or exc.context}{where}") from exc
    except yaml.YAMLError as exc:
        raise _InvalidFrontMatter(str(exc).split("\n", 1)[0]) from exc
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise _InvalidFrontMatter(f"expected a mapping, got {type(meta).__name__}")
    return meta, text[match.end() :].strip()


def _define(folder: str, meta: dict[str, object], body: str) -> _Definition:
    always = meta.get("always", False)
    if not isinstance(always, bool):
        raise _InvalidFrontMatter("'always' must be true or false")
    requires = meta.get("requires") or {}
    if not isinstance(requires, dict):
        raise _InvalidFrontMatter("'requires' must be a mapping with 'bins' and 'env'")
    return _Definition(
        name=_string(meta, "name") or folder,
        description=_string(meta, "description"),
        always=always,
        bins=_names(requires, "bins"),
        env=_names(requires, "env"),
        body=body,
    )


def _string(meta: dict[str, object], key: str) -> str:
    value = meta.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _InvalidFrontMatter(f"'{key}' must be a string")
    return value.strip()


def _names(requires: dict[object, object], key: str) -> tuple[str, ...]:
    value = requires.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _InvalidFrontMatter(f"'requires.{key}' must be a list of strings")
    return tuple(item.strip() for item in value if item.strip())
