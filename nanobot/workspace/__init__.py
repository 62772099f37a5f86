"""The agent's workspace: opening files in it, confined to it (`_confined`: see there how),
and what ships with nanobot to lay down in it (`_template`). Import from here."""

from nanobot.workspace._confined import (
    MAX_SYMLINK_HOPS,
    MAX_UNIQUE_NAMES,
    ConfinementError,
    OutsideWorkspace,
    UnsafeFile,
    Workspace,
)
from nanobot.workspace._template import bundled, copy_template

__all__ = [
    "MAX_SYMLINK_HOPS",
    "MAX_UNIQUE_NAMES",
    "ConfinementError",
    "OutsideWorkspace",
    "UnsafeFile",
    "Workspace",
    "bundled",
    "copy_template",
]
