"""Images in user messages: stored as file references, sent to the model inline.

A photo the user sends is saved in the workspace. The stored user message refers to it as
a `file://` image part, so the database holds no image bytes. The turn it arrives in sends
the model the image itself (a data URL); later turns see a one-line placeholder instead, so
one photo does not cost its size again on every turn.
"""

from __future__ import annotations

import asyncio
import base64
import mimetypes
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from nanobot.providers.base import Message
from nanobot.workspace import Workspace

MAX_INLINE_BYTES = 5 * 1024 * 1024  # providers refuse larger images anyway


def with_images(message: Message, paths: Sequence[Path]) -> Message:
    """`message` (text content) with image parts referring to `paths`."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": message["content"]}]
    # Not resolved: a symlink is judged when the image is read, confined to the workspace.
    parts += [{"type": "image_url", "image_url": {"url": p.absolute().as_uri()}} for p in paths]
    return {**message, "content": parts}


def has_images(message: Message) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(_file_image(part) for part in content)


def without_images(message: Message) -> Message:
    """`message` with stored image references replaced by a short text placeholder."""
    if not has_images(message):
        return message
    texts = []
    for part in message["content"]:
        path = _file_image(part)
        texts.append(f"[image: {path}]" if path else str(part.get("text", "")))
    return {**message, "content": "\n".join(texts)}


async def inline_images(message: Message, workspace: Workspace) -> Message:
    """`message` with stored image references turned into data URLs (read off the loop).

    Images are read confined to `workspace`: one that is missing, too large, or was replaced
    by a link leading out of it (or to a file with other hard links) becomes the text
    placeholder.
    """
    if not has_images(message):
        return message
    parts = []
    for part in message["content"]:
        path = _file_image(part)
        if path is None:
            parts.append(part)
            continue
        url = await asyncio.to_thread(_data_url, path, workspace)
        parts.append(
            {"type": "image_url", "image_url": {"url": url}}
            if url
            else {"type": "text", "text": f"[image: {path} (could not be read)]"}
        )
    return {**message, "content": parts}


def _file_image(part: object) -> Path | None:
    if not isinstance(part, dict) or part.get("type") != "image_url":
        return None
    url = str((part.get("image_url") or {}).get("url", ""))
    # as_uri() percent-encodes (a workspace folder may have spaces in its name).
    return Path(unquote(url.removeprefix("file://"))) if url.startswith("file://") else None


def _data_url(path: Path, workspace: Workspace) -> str | None:
    try:
        fd, info = workspace.open_file(path)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        if info.st_size > MAX_INLINE_BYTES:
            return None
        try:
            data = file.read()
        except OSError:
            return None
    mime = mimetypes.guess_type(path.name)[0] or "image/jpeg"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
