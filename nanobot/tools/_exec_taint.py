"""How one exec call follows taint (see `nanobot.tools.taint`).

Before the command: the files and folders it names are looked up in the ledger (one lookup),
and the egress path, if there is one, starts watching it. After: the output is untrusted when
the command named a marked file or fetched (what the egress path saw; without one, what
`may_fetch` reads in the command); and when the turn is tainted, now or before, every file
under the workspace whose inode changed since the command started is marked, and a named
mark whose file is gone is cleared. Clean turns running clean commands pay for none of it
but a stat or two per word of the command.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from nanobot.tools.base import ToolContext, current_context, untrusted
from nanobot.tools.registry import MAX_RESULT_CHARS
from nanobot.tools.taint import (
    Egress,
    EgressWatch,
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
    """One call's taint bookkeeping: make it with `before`, run the command inside `with`
    (which ends the egress watch), and finish with `after` once the command has ended."""

    command: str
    workspace: Path
    ledger: TaintLedger | None
    context: ToolContext | None
    named: tuple[str, ...]  # sources: the marked files the command names
    gone_candidates: tuple[str, ...]  # keys of those marks, to clear if deleted
    watch: EgressWatch | None
    since_ns: int

    @classmethod
    async def before(
        cls, command: str, workspace: Path, ledger: TaintLedger | None, egress: Egress | None
    ) -> ExecTaint:
        named: tuple[str, ...] = ()
        keys: tuple[str, ...] = ()
        if ledger is not None:
            files, folders = await asyncio.to_thread(named_paths, command, workspace)
            if files or folders:
                marks = await ledger.marks(files, under=folders)
                named = tuple(described(m) for m in marks)
                keys = tuple(m.path for m in marks)
        watch = egress.watch() if egress is not None else None
        return cls(
            command, workspace, ledger, current_context.get(), named, keys, watch, scan_start()
        )

    def __enter__(self) -> ExecTaint:
        return self

    def __exit__(self, *_: object) -> None:
        if self.watch is not None:
            self.watch.close()

    @property
    def env(self) -> Mapping[str, str]:
        """What the command's environment gains (the egress path's variables)."""
        return self.watch.env if self.watch is not None else {}

    def fetched(self) -> str | None:
        """Why the command's output came from the network, if it did (or may have)."""
        if self.watch is None:
            return may_fetch(self.command)
        hosts = self.watch.hosts()
        return cut(f"the output of a command that reached {', '.join(hosts)}") if hosts else None

    async def after(self, output: str) -> tuple[str, tuple[str, ...]]:
        """The output as the model should see it, and the sources it carries. Marks what
        the command changed when the turn is tainted.

        Raises:
            StoreError: the ledger could not be written (the command has run).
        """
        fetched = self.fetched()
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
            await self.ledger.clear(gone)
        if not changed:
            return ""
        await self.ledger.mark(changed, taint.written(), replace=False)
        shown = ", ".join(changed[:20]) + (
            f" and {len(changed) - 20} more" if len(changed) > 20 else ""
        )
        return f"\n[files this command changed now count as holding content from outside: {shown}]"
