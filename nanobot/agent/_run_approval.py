"""The approval hook of one run, and what it has taken in from outside so far."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nanobot.agent.approvals import DEFAULT_POLICIES, UNTRUSTED_TOOLS, Taint
from nanobot.agent.run import Approval, RunEvent
from nanobot.providers.base import ToolCall

if TYPE_CHECKING:
    from nanobot.agent.approver import Approver, Caller


@dataclass
class RunApproval:
    """The approval hook of one run (`RunHooks.approve`), and its taint: `observe` is a run
    listener that notes each tool result the run takes in."""

    approver: Approver
    caller: Caller
    run_id: str
    taint: Taint = field(default_factory=Taint)
    hosts: set[str] = field(default_factory=set)  # fetched from (or approved) in this turn

    async def approve(self, call: ToolCall) -> Approval:
        return await self.approver.check(self, call)

    def observe(self, event: RunEvent) -> None:
        if event.kind == "tool_end" and event.tool_call is not None:
            name = event.tool_call.name
            if name in UNTRUSTED_TOOLS or name not in DEFAULT_POLICIES:
                self.taint = self.taint.after(name)
                return
            for source in event.taint:  # what its result carries: a marked file, a fetch
                self.taint = self.taint.with_source(source)


async def fetched_once(run: RunApproval, host: str, decision: Awaitable[str | None]) -> str | None:
    """`decision`; once it allows the fetch, `host` does not ask again in this turn."""
    result = await decision
    if result is None:
        run.hosts.add(host)
    return result
