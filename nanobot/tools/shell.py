"""The exec tool: run a shell command in the workspace, inside the OS sandbox.

The contract is: `/bin/sh -c command` inside the sandbox exec was given (see `bubblewrap.py`:
bubblewrap, with only the workspace writable and nothing of nanobot's data visible), working
directory the workspace, a minimal environment (PATH, LANG, TERM=dumb, and what the sandbox
adds: HOME, a fresh empty folder per call, and the egress proxy's variables; none of
nanobot's API keys or tokens), and a deadline. The sandbox (or, unsandboxed, the shell) is
started in its own process group; when the command ends, times out or the call is cancelled,
that group is stopped (SIGTERM, a short grace, SIGKILL). Inside bubblewrap that ends every
process the command started, also those that left the group with `setsid` or a double fork:
they live in the sandbox's PID namespace, which dies with it. The call returns, or raises
(cancellation included), only once the group is empty and, when exec stopped a running
sandbox (timeout, cancellation), its namespace is too; after KILL_WAIT it gives up with a
warning (a process stuck in the kernel). When the command ends by itself, bubblewrap exits
first and the kernel ends what is left of its namespace just after.

The deny patterns are a speed bump against an obviously destructive command typed by a
confused model, not a security boundary: a shell offers endless ways to spell the same thing.
The sandbox is the boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Coroutine, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from nanobot.reserve import DiskReserve, Shortage
from nanobot.sizes import format_size
from nanobot.tools._bwrap_gate import Gate
from nanobot.tools._exec_taint import ExecTaint
from nanobot.tools._process import Process, namespace_inits, start, stop_group
from nanobot.tools.base import Tool, ToolError, ToolParams, ToolResult, current_context
from nanobot.tools.bubblewrap import Bubblewrap
from nanobot.tools.limit_scope import Scope, close_scope, open_scope
from nanobot.tools.limits import KEY, NO_LIMITS, Enforcement
from nanobot.tools.sandbox import Sandbox, SandboxCall
from nanobot.tools.taint import TaintLedger

DEFAULT_DENY_PATTERNS: tuple[str, ...] = (
    # rm with a recursive flag aimed at /, /*, ~ or $HOME
    r"\brm\s+(?=(?:-\S+\s+)*-\S*[rR])(?:-\S+\s+)+"
    r"[\"']?(?:/|~|\$HOME|\$\{HOME\})/?\*?[\"']?(?=$|[\s;&|)])",
    r"\bmkfs(?:\.\w+)?\b",
    r"\bdd\b[^;&|]*\bof=/dev/(?!null\b)",
    r">\s*/dev/(?:sd|hd|vd|xvd|nvme|mmcblk|disk)",
    r":\(\)\s*\{\s*:\s*\|\s*:\s*&\s*\}\s*;\s*:",  # the classic fork bomb
    r"(?:^|[;&|(]|\bsudo)\s*(?:shutdown|reboot|halt|poweroff)\b",
    r"\bsystemctl\s+(?:poweroff|reboot|halt|kexec)\b",
)

MAX_OUTPUT_BYTES = 64 * 1024
EXIT_GRACE = 0.5  # seconds to wait for output after the shell itself has exited


class ExecParams(ToolParams):
    command: str = Field(description="Shell command, run with /bin/sh -c in the workspace.")
    timeout: float | None = Field(
        default=None,
        gt=0,
        description="Seconds before the command is killed; capped at the configured maximum.",
    )


class ExecTool(Tool[ExecParams]):
    """Runs a shell command in the workspace, in `sandbox`, with a minimal environment and a
    deadline."""

    name = "exec"
    description = (
        "Run a shell command (/bin/sh -c) in the workspace directory and return its exit code "
        "and combined stdout/stderr. It runs in a sandbox: only the workspace is writable, "
        "files outside it are not visible, HOME is a fresh empty folder each call (nothing "
        "written there is kept; make a venv in the workspace for packages), the network (by "
        "default) is the public internet only, through a proxy curl, pip, git and npm use by "
        "themselves, and background processes are stopped when the command ends. No "
        "credentials or API keys are in its environment."
    )
    params = ExecParams

    def __init__(
        self,
        workspace: Path,
        *,
        sandbox: Sandbox,
        timeout: float = 60,
        deny_patterns: Sequence[str] = DEFAULT_DENY_PATTERNS,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
        limits: Enforcement = NO_LIMITS,
        reserve: DiskReserve | None = None,
        ledger: TaintLedger | None = None,
    ) -> None:
        """`ledger`: how the command's taint is followed (see `_exec_taint`)."""
        self.workspace = workspace
        self.ledger = ledger
        self.sandbox = sandbox
        self.timeout = timeout
        self.max_output_bytes = max_output_bytes
        self.limits = limits
        self.reserve = reserve
        self._deny: list[re.Pattern[str]] = []
        for pattern in deny_patterns:
            try:
                self._deny.append(re.compile(pattern))
            except re.error as exc:
                raise ValueError(f"invalid exec deny pattern {pattern!r}: {exc}") from None

    async def run(self, args: ExecParams) -> str | ToolResult:
        if not self.sandbox.ready:  # the masks' first walk, at the first call
            await asyncio.to_thread(self.sandbox.wait_ready)
        with self.sandbox.call() as call:
            return await self._limited(args, call)

    async def _limited(self, args: ExecParams, call: SandboxCall) -> str | ToolResult:
        """`args.command` in the sandbox call `call`, within the command limits."""
        person = _person_root()
        # Refused if there is no sandbox (or none that keeps people apart).
        self.sandbox.command(["/bin/sh", "-c", args.command], call=call, person=person)
        for pattern in self._deny:
            if pattern.search(args.command):
                raise ToolError(
                    "command refused as dangerous (it matches the deny pattern "
                    f"{pattern.pattern!r}). If it is really needed, ask the user to run it."
                )
        if self.reserve is not None and (short := self.reserve.short()) is not None:
            raise ToolError(f"no space left: {_shortage(short)}; the command was not run.")
        try:
            scope = await open_scope(self.limits, self.reserve, self.workspace)
        except OSError as exc:
            raise ToolError(f"could not set up the command's limits: {exc}") from None
        try:
            return await self._run(args, call, scope)
        finally:
            await close_scope(scope)

    @property
    def _offline(self) -> bool:
        """Whether commands have no network at all (`network: none`): nothing they print
        came from it."""
        return isinstance(self.sandbox, Bubblewrap) and self.sandbox.confinement.network == "none"

    async def _run(self, args: ExecParams, call: SandboxCall, scope: Scope) -> str | ToolResult:
        person = _person_root()
        cwd = person if person is not None else self.workspace
        taint = await ExecTaint.before(args.command, cwd, self.ledger, keys_from=self.workspace)
        command = ["/bin/sh", "-c", args.command]
        gate = Gate() if self.sandbox.gated and scope.held else None
        try:
            if gate is not None:
                argv = self.sandbox.command(
                    command, call=call, gate=gate, launched=True, person=person
                )
                fds = gate.pass_fds
            else:
                inner = self.sandbox.command(
                    scope.inner(command), call=call, launched=True, person=person
                )
                argv, fds = scope.outer(inner), ()
        except ValueError as exc:
            raise ToolError(f"the command cannot run in your folder: {exc}") from None
        timeout = min(args.timeout or self.timeout, self.timeout)
        env = _minimal_env(cwd, self.sandbox.path, call.env)
        try:
            try:
                process = await start(
                    argv,
                    cwd,
                    env,
                    self.max_output_bytes,
                    (*call.pass_fds, *fds),
                    launcher=self.sandbox.launcher,
                    group=scope.group,
                )
            except OSError as exc:
                raise ToolError(f"could not start the command: {exc}") from None
            if gate is not None:
                gate.started()
            watch = asyncio.create_task(
                scope.watch(partial(_sandbox_tmp, process.pid)), name="exec watch"
            )
            try:
                held = _open(gate, scope) if gate is not None else None
                outcome = await _supervise(process, timeout, scope.stop, held)
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
                process.close()
        finally:
            if gate is not None:
                gate.close()  # the sandbox is stopped by now
        code, text = process.returncode, process.output.text()
        ended, met = scope.verdict(code, text)
        output, sources = await taint.after(text, call.egress, offline=self._offline)
        if outcome == "timeout":
            reached = f"; it had reached {ended}" if ended else ""
            return _failed(
                f"the command timed out after {timeout:g} s and was stopped{reached}. Output "
                f"before that:\n{output}",
                sources,
            )
        if outcome == "stopped" and scope.shortage is not None:
            return _failed(
                f"the command was stopped, no space left: {_shortage(scope.shortage)}. "
                f"Output before that:\n{output}",
                sources,
            )
        if ended:
            return _failed(
                f"the command was ended at {ended} ({_describe_exit(code)}). Output:\n{output}",
                sources,
            )
        said = f" (it reports having met {met})" if met else ""
        text = f"{_describe_exit(code)}{said}\n{output}"
        return ToolResult(text, taint=sources) if sources else text


def _failed(error: str, sources: tuple[str, ...]) -> ToolResult:
    """A command that did not end well: an error for the model, its output inside untrusted
    markers when it carries content from outside (`sources`).

    Raises:
        ToolError: it carries none (the registry makes the same error of it).
    """
    if not sources:
        raise ToolError(error)
    return ToolResult(f"Error: {error}", is_error=True, taint=sources)


def _shortage(short: Shortage) -> str:
    """Why a command may not take more of the data volume, for the model and the person."""
    return (
        f"only {format_size(short.free)} is free on the volume of nanobot's data "
        f"({short.volume}), where {format_size(short.reserve)} is kept for nanobot's store "
        f"({KEY}.disk_reserve). Free some space there (in the workspace, say)"
    )


def _sandbox_tmp(pid: int) -> Path | None:
    """The sandbox's /tmp as seen from outside, through its init's root; None until the
    sandbox is up (or without one)."""
    inits = namespace_inits(pid)
    return Path(f"/proc/{inits[0]}/root/tmp") if inits else None


async def _open(gate: Gate, scope: Scope) -> None:
    """Put the sandbox held at `gate` under `scope`'s limits, then let its command start.
    When bubblewrap ended without making its sandbox, nothing is opened: its output says why.

    Raises:
        ToolError: a limit could not be set (the sandbox is then to be stopped, not let go).
    """
    init = await gate.init()
    if init is None:
        return
    try:
        scope.hold(init)
    except ProcessLookupError:
        return  # bubblewrap's setup failed, its init gone: its output says why
    except OSError as exc:
        raise ToolError(f"could not set up the command's limits: {exc}") from None
    gate.release()


async def _supervise(
    process: Process,
    seconds: float,
    stop: asyncio.Event,
    held: Coroutine[Any, Any, None] | None = None,
) -> Literal["exited", "timeout", "stopped"]:
    """Await `held` (the sandbox's gate opened), then wait up to `seconds` in all for the
    shell to exit, or for `stop` (a limit's watch); then stop its group; say which came
    first.

    The group is stopped on cancellation and on an error of `held` too, before it propagates.
    """
    try:
        async with asyncio.timeout(seconds):
            if held is not None:
                await held
            await _first(process.exited, stop)
            if not process.exited.is_set():
                return "stopped"
            # A background child may hold the pipe open after the shell exits; what it wrote
            # so far is kept, and stopping the group ends it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.output.closed.wait(), EXIT_GRACE)
    except TimeoutError:
        return "timeout"
    finally:
        await stop_group(process.pid, process)
    return "exited"


async def _first(*events: asyncio.Event) -> None:
    """Wait until one of `events` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _person_root() -> Path | None:
    """The folder of the person the current turn runs as, when people are kept apart."""
    context = current_context.get()
    return context.root if context is not None and context.shared is not None else None


def _minimal_env(workspace: Path, path: str, sandbox: Mapping[str, str]) -> dict[str, str]:
    """The whole environment a command sees: nothing of nanobot's secrets. `sandbox`: what
    the sandbox adds for this call (HOME, the proxy variables); HOME is the workspace where
    it gives none."""
    return {
        "PATH": path,
        "HOME": str(workspace),
        "LANG": os.environ.get("LANG") or "C.UTF-8",
        "TERM": "dumb",  # no colour codes or pagers in output meant for a model
        **sandbox,
    }


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
