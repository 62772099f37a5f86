"""What the model sees of an MCP server's answer: its content as text, inside the
untrusted-content markers (a server's output is content from outside, like a fetched page:
it taints the turn), cut to the tools' limit with a note of how much was cut."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from nanobot.tools.base import ToolImage, ToolResult, untrusted
from nanobot.tools.registry import MAX_RESULT_CHARS

if TYPE_CHECKING:
    import mcp_types

# Room for the markers and the cut note inside MAX_RESULT_CHARS: the registry must not cut
# the closing marker off.
_TEXT_LIMIT = MAX_RESULT_CHARS - 600
# What one result may show a model of images: providers refuse larger ones, and a result is
# shown again on each of the turn's later model calls.
MAX_IMAGES, MAX_IMAGE_BYTES = 4, 5 * 1024 * 1024


def tool_result(offered: str, server: str, result: mcp_types.CallToolResult) -> ToolResult:
    """`result` of the tool the model calls `offered`, for the model."""
    images: list[ToolImage] = []
    parts = [_content(block, images) for block in result.content]
    structured = result.structured_content
    if structured is not None and not _said(parts, structured):
        parts.append(json.dumps(structured, ensure_ascii=False, separators=(",", ":")))
    text = "\n".join(p for p in parts if p) or "(the tool returned nothing)"
    return replace(
        wrapped(offered, server, text, is_error=bool(result.is_error)), images=tuple(images)
    )


def resources_result(offered: str, server: str, resources: list[mcp_types.Resource]) -> ToolResult:
    lines = [
        f"{r.uri}  {r.name}"
        + (f" ({r.mime_type})" if r.mime_type else "")
        + (f": {r.description}" if r.description else "")
        for r in resources
    ]
    return wrapped(offered, server, "\n".join(lines) or "(no resources)")


def resource_result(offered: str, server: str, result: mcp_types.ReadResourceResult) -> ToolResult:
    return wrapped(offered, server, "\n".join(_resource(c) for c in result.contents))


def wrapped(offered: str, server: str, text: str, *, is_error: bool = False) -> ToolResult:
    """`text` from `server`, cut to fit and marked as content from outside (its taint the
    tool's: "a <offered> result", as the approvals name it)."""
    if len(text) > _TEXT_LIMIT:
        cut, whole = len(text) - _TEXT_LIMIT, len(text)
        text = f"{text[:_TEXT_LIMIT]}\n[... {cut} more characters cut; the result was {whole} long]"
    source = f"MCP server {server}, tool {offered}"
    content = untrusted(source, text)
    if is_error:
        content = f"Error: the tool reported a failure:\n{content}"
    return ToolResult(content, is_error, (f"a {offered} result",))


def _content(block: Any, images: list[ToolImage]) -> str:
    """`block` as text; an image that can be shown is added to `images` too."""
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return _media(kind, block, images)
    if kind == "resource":
        return _resource(block.resource)
    if kind == "resource_link":
        what = f" ({block.mime_type})" if getattr(block, "mime_type", None) else ""
        return f"[resource {block.name}{what}: {block.uri}]"
    return f"[content of type {kind or 'unknown'}]"


def _media(kind: str, block: Any, images: list[ToolImage]) -> str:
    size = len(block.data) * 3 // 4  # base64
    what = f"[{kind} ({block.mime_type}, about {size:,} bytes)"
    if kind == "audio" or not str(block.mime_type).startswith("image/"):
        return f"{what}: not shown]"
    if size > MAX_IMAGE_BYTES or len(images) == MAX_IMAGES:
        return f"{what}: too large or too many to show]"
    images.append(ToolImage(block.mime_type, block.data))
    return f"{what}: image {len(images)}]"


def _resource(contents: Any) -> str:
    text = getattr(contents, "text", None)
    if isinstance(text, str):
        return f"[resource {contents.uri}]\n{text}"
    kind = getattr(contents, "mime_type", None) or "binary"
    return f"[resource {contents.uri}: {kind} data, not shown]"


def _said(parts: list[str], structured: Any) -> bool:
    """Whether a text part already is `structured` as JSON (servers are asked to send both)."""
    for part in parts:
        try:
            if json.loads(part) == structured:
                return True
        except ValueError:
            continue
    return False
