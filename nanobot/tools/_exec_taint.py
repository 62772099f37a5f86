"""How one exec call follows taint (see `nanobot.tools.taint`).

Before the command: the files and folders it names are looked up in the ledger (one lookup).
After: the output is untrusted when the command named a marked file or fetched (what the
egress proxy recorded of it, `EgressRecord`; without the proxy, `network: host`, what
`may_fetch` reads in the command); and when the turn is tainted, now or before, every file
under the workspace whose inode changed since the command started is marked, and a named
mark whose file is gone is cleared. Clean turns running clean commands pay for none of it
but a stat or two per word of the command.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from nanobot.tools.base import ToolContext, current_context, untrusted
from nanobot.tools.egress import EgressRecord
from nanobot.tools.registry import MAX_RESULT_CHARS
from nanobot.tools.taint import (
    TaintLedger,
    TurnTaint,
    changed_since,
    cut,
    described,
    may_fetch,
    named_paths,
    scan_start,
)

# The wrapped output must fit in a result whole, its closing marker included.
_OUTPUT_BUDGET = MAX_RESULT_CHARS - 1500


@dataclass
class ExecTaint:
    """One call's taint bookkeeping: make it with `before`, finish it with `after` once the
    command has ended."""

    command: str
    workspace: Path
    ledger: TaintLedger | None
    context: ToolContext | None
    named: tuple[str, ...]  # sources: the marked files the command names
    gone_candidates: tuple[str, ...]  # keys of those marks, to clear if deleted
    since_ns: int
    prefix: str = ""  # of the keys: where `workspace` lies in the ledger's workspace

    @classmethod
    async def before(
        cls,
        command: str,
        workspace: Path,
        ledger: TaintLedger | None,
        *,
        keys_from: Path | None = None,
    ) -> ExecTaint:
        """`workspace`: where the command runs; `keys_from`: the folder the ledger's keys
        are relative to, when that is not it (a person's folder lies in the workspace)."""
        prefix = ""
        if keys_from is not None and workspace != keys_from:
            prefix = workspace.relative_to(keys_from).as_posix() + "/"
        named: tuple[str, ...] = ()
        keys: tuple[str, ...] = ()
        if ledger is not None:
            files, folders = await asyncio.to_thread(named_paths, command, workspace)
            files = {prefix + f for f in files}
            folders = {prefix + f for f in folders}
            if files or folders:
                marks = await ledger.marks(files, under=folders)
                named = tuple(described(m) for m in marks)
                keys = tuple(m.path[len(prefix) :] for m in marks if m.path.startswith(prefix))
        context = current_context.get()
        return cls(command, workspace, ledger, context, named, keys, scan_start(), prefix)

    def fetched(self, egress: EgressRecord | None, *, offline: bool = False) -> str | None:
        """Why the command's output came from the network, if it did (or may have): what
        the proxy recorded (`egress`), or without one what the command reads like; never
        when it had no network (`offline`)."""
        if offline:
            return None
        if egress is None:
            return may_fetch(self.command)
        if not egress.used:  # refusals only: the proxy's own words came back, nothing else
            return None
        hosts = ", ".join(sorted(egress.hosts)) or "the network"
        return cut(f"the output of a command that reached {hosts}")

    async def after(
        self, output: str, egress: EgressRecord | None = None, *, offline: bool = False
    ) -> tuple[str, tuple[str, ...]]:
        """The output as the model should see it, and the sources it carries (`egress`:
        what the proxy recorded of the command, None where none watched it; `offline`: it had
        no network). Marks what the
        command changed when the turn is tainted.

        Raises:
            StoreError: the ledger could not be written (the command has run).
        """
        fetched = self.fetched(egress, offline=offline)
        sources = (*self.named, *([fetched] if fetched else ()))
        turn = self.context.taint if self.context is not None else TurnTaint()
        if self.ledger is not None and (turn or sources):
            output += await self._mark_changes(TurnTaint((*turn.sources, *sources)))
        if not sources:
            return output, ()
        if len(output) > _OUTPUT_BUDGET:
            cut_chars = len(output) - _OUTPUT_BUDGET
            output = f"{output[:_OUTPUT_BUDGET]}\n[... {cut_chars} more characters cut]"
        return untrusted(", ".join(sources), output), sources

    async def _mark_changes(self, taint: TurnTaint) -> str:
        assert self.ledger is not None
        changed, whole = await asyncio.to_thread(changed_since, self.workspace, self.since_ns)
        if not whole:
            logger.warning(
                "exec: the workspace has more entries than the change scan looks at; files "
                "past them that this tainted command changed are not marked"
            )
        gone = [k for k in self.gone_candidates if not (self.workspace / k).exists()]
        if gone:
            await self.ledger.clear([self.prefix + k for k in gone])
        if not changed:
            return ""
        await self.ledger.mark([self.prefix + k for k in changed], taint.written(), replace=False)
        shown = ", ".join(changed[:20]) + (
            f" and {len(changed) - 20} more" if len(changed) > 20 else ""
        )
        return f"\n[files this command changed now count as holding content from outside: {shown}]"
