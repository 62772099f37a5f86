"""The agent's workspace: where the bundled template is, and laying it down on first run."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def bundled(name: str) -> Path:
    """A file or folder shipped with nanobot (`workspace_template`, `config.example.yaml`).

    Wheels carry them inside the package; an editable install finds them at the repository
    root.

    Raises:
        FileNotFoundError: the installation is incomplete.
    """
    inside = Path(str(resources.files("nanobot").joinpath(name)))
    for candidate in (inside, _PACKAGE_DIR.parent / name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{name} is missing from this nanobot installation")


def copy_template(workspace: Path) -> list[Path]:
    """Copy the workspace template into `workspace`, never overwriting an existing file.

    Returns the files it created (empty when everything was already there).
    """
    template = bundled("workspace_template")
    created: list[Path] = []
    for source in sorted(template.rglob("*")):
        if source.is_dir() or "__pycache__" in source.parts:
            continue
        target = workspace / source.relative_to(template)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        created.append(target)
    return created
