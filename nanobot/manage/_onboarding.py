"""`nanobot onboard`: the first config file and the workspace."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from nanobot.config import load
from nanobot.workspace import bundled, copy_template


def onboard(path: Path, answers: dict[str, str]) -> list[str]:
    """Write the config (from the example, with `answers` filled in) and the workspace.

    Never overwrites: an existing config is kept and only missing workspace files are added.
    Returns what it did, one line each.

    Raises:
        ConfigError: the existing (or written) config is not valid.
    """
    lines: list[str] = []
    if path.exists():
        lines.append(f"config: {path} exists; left as it is")
    else:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        text = _fill_example(bundled("config.example.yaml").read_text(encoding="utf-8"), answers)
        # Exclusive create: a file that appeared meanwhile is not clobbered; 0600 as it may
        # hold an API key.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        lines.append(f"config: wrote {path}")
    config = load(path)
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    created = copy_template(config.workspace_path)
    state = f"added {len(created)} files" if created else "already complete"
    lines.append(f"workspace: {config.workspace_path} ({state})")
    if config.agent.api_key is None:  # what the file (or the environment) says, not the answers
        lines.append(
            "next: set agent.api_key (or your provider's key variable), then `nanobot agent -m hi`"
        )
    return lines


def _fill_example(text: str, answers: dict[str, str]) -> str:
    # A new install keeps people apart, said in its config (an absent key means `shared` on
    # a store that already holds conversations: see `nanobot.people.shared_mode`).
    text = re.sub(r"(?m)^  isolation: null$", "  isolation: person", text, count=1)
    for key in ("model", "api_key", "api_base"):
        value = answers.get(key)
        if value:
            # A JSON string is a valid YAML scalar; escaped so re.sub takes it literally.
            line = f"  {key}: {json.dumps(value)}".replace("\\", "\\\\")
            text = re.sub(rf"(?m)^  {key}: .*$", line, text, count=1)
    return text
