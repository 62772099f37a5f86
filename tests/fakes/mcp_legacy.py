"""The fake MCP server (`mcp_server.py`) over stdio as a server of the handshake era only: a
front that answers the client's `server/discover` probe with "method not found", so an SDK
client in `mode="auto"` falls back to the `initialize` handshake (2025-11-25), and passes every
other line through, both ways. A script, like the fake; its arguments are the fake's::

    python tests/fakes/mcp_legacy.py --resources

The fake runs as this process's child, in its process group; it ends when its input does.
"""

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

SCRIPT = Path(__file__).with_name("mcp_server.py")
METHOD_NOT_FOUND = -32601


def _refusal(message: object) -> bytes | None:
    """The error answer to `message` if it is the era probe, else None."""
    if not isinstance(message, dict) or message.get("method") != "server/discover":
        return None
    error = {"code": METHOD_NOT_FOUND, "message": "Method not found"}
    return json.dumps({"jsonrpc": "2.0", "id": message.get("id"), "error": error}).encode()


def main() -> None:
    child = subprocess.Popen(
        [sys.executable, str(SCRIPT), *sys.argv[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdin is not None and child.stdout is not None
    out = sys.stdout.buffer
    lock = threading.Lock()  # whole lines: the fake's answers and the refusals interleave

    def write(line: bytes) -> None:
        with lock:
            out.write(line)
            out.flush()

    def pump(source: IO[bytes]) -> None:
        for line in source:
            write(line)

    threading.Thread(target=pump, args=(child.stdout,), daemon=True).start()
    for line in sys.stdin.buffer:
        try:
            refusal = _refusal(json.loads(line))
        except ValueError:
            refusal = None
        if refusal is not None:
            write(refusal + b"\n")
            continue
        child.stdin.write(line)
        child.stdin.flush()
    child.stdin.close()
    sys.exit(child.wait())


if __name__ == "__main__":
    main()
