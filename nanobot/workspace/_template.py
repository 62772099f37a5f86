"""What ships with nanobot (the workspace template, the example config), and laying the
template down in a workspace on first run."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from loguru import logger

from nanobot.workspace._confined import Workspace

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # nanobot/


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

    Returns the files it created (empty when everything was already there). Written through
    `Workspace.create`, so a symlink planted where a template file belongs is left alone,
    never written through; a file that cannot be placed is logged and skipped.
    """
    template = bundled("workspace_template")
    workspace.mkdir(parents=True, exist_ok=True)
    confined = Workspace(workspace)
    created: list[Path] = []
    for source in sorted(template.rglob("*")):
        if source.is_dir() or "__pycache__" in source.parts:
            continue
        relative = source.relative_to(template)
        try:
            made = confined.put_new(relative.parent, relative.name, source.read_bytes())
        except OSError as exc:
            logger.warning("Workspace template file {} not copied: {}", relative, exc)
            continue
        if made:
            created.append(workspace / relative)
    return created
