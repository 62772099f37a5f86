"""The original nanobot (PyPI ``nanobot-ai`` 0.3.5), installed once and driven as a user would.

``install()`` makes a venv of its own under ``~/.cache/nanobot-bench/nanobot-ai-0.3.5/``
(``$XDG_CACHE_HOME`` if set; outside the repository) with ``python -m venv`` and pip, then
installs its Telegram channel's dependencies (python-telegram-bot is not one of the
package's own) with its own ``nanobot plugins enable telegram``, in a throwaway HOME (the
command also turns the channel on in that HOME's config). A stamp file records the installed
versions; later runs reuse the venv. A lock keeps two benchmarks from installing at once.
When anything fails, ``install()`` returns the one-line reason instead, and the original's
rows are skipped.

Its config is ``~/.nanobot/config.json`` (camelCase keys); every run gets a HOME of its own.
The equivalent of our default config is ``agents.defaults.model: openai/gpt-4o-mini`` with
``providers.openai.apiKey``; ``providers.openai.apiBase`` is our ``agent.api_base`` (without
it, the openai SDK it calls reads ``OPENAI_BASE_URL``, as our gateway does).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import isolated_env
from tests.fakes.telegram import DEFAULT_TOKEN

VERSION = "0.3.5"
REQUIREMENT = f"nanobot-ai=={VERSION}"
API_KEY = "sk-bench-not-a-secret"
MODEL = "openai/gpt-4o-mini"  # ours and its: the same default model, the same provider
INSTALL_LIMIT_S = 1200.0
# The versions worth recording beside the figures.
_RECORDED = ("nanobot-ai", "python-telegram-bot", "openai", "httpx", "pydantic", "typer")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nanobot-bench" / f"nanobot-ai-{VERSION}"


@dataclass(frozen=True)
class Original:
    """An installed original nanobot."""

    root: Path
    packages: dict[str, str]  # name -> version, of those in _RECORDED

    @property
    def nanobot(self) -> str:
        return str(self.root / "venv" / "bin" / "nanobot")

    def agent_env(self, home: Path, llm_url: str) -> dict[str, str]:
        """A HOME for ``nanobot agent -m``: the default model, its API at ``llm_url``."""
        provider = {"apiKey": API_KEY, "apiBase": llm_url}
        return self._home(home, {"providers": {"openai": provider}})

    def gateway_env(
        self, home: Path, *, llm_url: str, proxy_url: str, ca_file: Path, websocket_port: int
    ) -> dict[str, str]:
        """A HOME for ``nanobot gateway`` on its default config with Telegram on.

        The model's API comes from ``OPENAI_BASE_URL``; Telegram is reached through the
        proxy at ``proxy_url`` that plays api.telegram.org (bench/_telegram_tunnel.py), whose
        CA the process trusts through ``SSL_CERT_FILE``. Its WebSocket channel, on by
        default, stays on, on a free port instead of the fixed 8765.
        """
        channels = {
            "telegram": {
                "enabled": True,
                "token": DEFAULT_TOKEN,
                "allowFrom": ["*"],
                "proxy": proxy_url,
            },
            "websocket": {"port": websocket_port},
        }
        config = {"providers": {"openai": {"apiKey": API_KEY}}, "channels": channels}
        env = self._home(home, config)
        env.pop("SSL_CERT_DIR", None)  # only the tunnel's CA is trusted
        env.update(OPENAI_BASE_URL=llm_url, SSL_CERT_FILE=str(ca_file))
        return env

    @staticmethod
    def _home(home: Path, config: dict[str, Any]) -> dict[str, str]:
        folder = home / ".nanobot"
        folder.mkdir(parents=True, exist_ok=True)
        document = {"agents": {"defaults": {"model": MODEL}}, **config}
        (folder / "config.json").write_text(json.dumps(document, indent=2), encoding="utf-8")
        return isolated_env(home)


def install() -> Original | str:
    """The original, installed if it is not yet; or why it could not be (one line)."""
    root = cache_dir()
    stamp = root / "installed.json"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _locked(root / ".lock"):
            if not stamp.is_file():
                _install(root, stamp)
            packages: dict[str, str] = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"{REQUIREMENT} could not be installed in {root}: {_one_line(exc)}"
    return Original(root, {k: v for k, v in packages.items() if k in _RECORDED})


def describe(found: Original | str) -> dict[str, Any]:
    """For the results: what was installed where, or why it was skipped."""
    if isinstance(found, str):
        return {"requirement": REQUIREMENT, "skipped": found}
    return {
        "requirement": REQUIREMENT,
        "venv": str(found.root / "venv"),
        "packages": found.packages,
    }


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _install(root: Path, stamp: Path) -> None:
    print(f"  installing {REQUIREMENT} into {root} (once)", file=sys.stderr, flush=True)
    venv = root / "venv"
    python = str(venv / "bin" / "python")
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([python, "-m", "pip", "install", "--quiet", REQUIREMENT])
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-original-") as home:
        _run([str(venv / "bin" / "nanobot"), "plugins", "enable", "telegram"], home=home)
    _run([python, "-c", "import telegram"])
    listed = json.loads(_run([python, "-m", "pip", "list", "--format", "json"]))
    versions = {str(p["name"]).lower(): str(p["version"]) for p in listed}
    stamp.write_text(json.dumps(versions, indent=2), encoding="utf-8")


def _run(argv: list[str], *, home: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "NANOBOT"))}
    if home is not None:
        env["HOME"] = home
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=INSTALL_LIMIT_S,
        check=False,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR")] or lines
        raise subprocess.SubprocessError(
            f"{' '.join(argv[:4])} ... exited {done.returncode}: "
            + (errors[-1] if errors else "(no output)")
        )
    return done.stdout


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
