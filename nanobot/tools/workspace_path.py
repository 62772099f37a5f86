"""Where a path the model gives points to, and whether a file tool may use it.

Every file tool resolves the model's paths through `resolve`, so confinement to the workspace
is decided in one place. The check is on the fully resolved path (symlinks followed, `..`
collapsed, `~` expanded) and compares path components, so `/ws-other` is not inside `/ws`.

This check gives the model a clear answer ("outside the workspace, it resolves to …"); it is
not what keeps the file tools inside. The path is checked, then opened, and the model's shell
can swap a directory for a symlink in between: so the tools open what `resolve` returned
through `nanobot.workspace.Workspace`, which walks it again component by component from a
descriptor of the workspace and never follows a symlink out.
"""

from __future__ import annotations

import os
from pathlib import Path

from nanobot.tools.base import ToolError


def resolve(workspace: Path, raw: str, *, restrict: bool) -> Path:
    """The real, absolute path `raw` names.

    Relative paths are taken from `workspace`; `~` is expanded. Symlinks are resolved, also
    for paths that do not exist yet (the deepest existing part is resolved and the rest
    appended), so a file about to be written through a symlink is judged by where it lands.

    Raises:
        ToolError: `raw` is empty or contains a NUL byte, names an unknown `~user`, or, with
            `restrict`, resolves to somewhere outside the workspace.
    """
    if not raw.strip():
        raise ToolError("the path is empty; give a path relative to the workspace, e.g. 'notes.md'")
    if "\0" in raw:
        raise ToolError(f"the path {raw!r} contains a NUL byte; paths cannot contain one")
    try:
        expanded = Path(raw).expanduser()
    except RuntimeError as exc:  # `~name` for a user that does not exist
        raise ToolError(f"the path {raw!r} cannot be expanded: {exc}") from None
    root = Path(os.path.realpath(workspace.expanduser()))
    # realpath(strict=False) follows every symlink that exists, including dangling ones, and
    # appends the components that do not exist yet: exactly "deepest existing parent + rest".
    path = Path(os.path.realpath(root / expanded))
    if restrict and not path.is_relative_to(root):
        shown = "" if path == Path(raw) else f" (it resolves to {path})"
        raise ToolError(
            f"path {raw!r} is outside the workspace ({root}){shown}; "
            "only files inside it can be used"
        )
    return path
