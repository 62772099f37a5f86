"""Which saved approval still holds for a call: the fingerprint of the code an exec call would
run, and the grant of the person or place whose code is unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from nanobot.agent.approvals import Subject, voided
from nanobot.agent.code_pins import Unpinned, changed, pin
from nanobot.store import ApprovalStore
from nanobot.store.approvals import Grant, Turn


async def pinned(
    what: Subject, arguments: Mapping[str, object], workspace: Path
) -> tuple[Subject, str]:
    """`what` with the fingerprint of the code it runs ('' when there is none to take: not
    exec, or offered once only anyway), or made once-only, saying why, when that code
    cannot be pinned. Reads the files in a thread; cancelling leaves nothing behind."""
    command = arguments.get("command")
    if what.tool != "exec" or what.scopes == ("once",) or not isinstance(command, str):
        return what, ""
    pins = await asyncio.to_thread(pin, command, workspace)
    if isinstance(pins, Unpinned):
        reason = f"what it runs cannot be pinned, {pins.reason}"
        return replace(what, scopes=("once",), once_only=reason), ""
    return what, pins.text


async def holding(
    store: ApprovalStore, what: Subject, turn: Turn, fingerprint: str
) -> tuple[Grant | None, str | None]:
    """The grant of `turn`'s person or place that still holds for `what` (for exec: the
    code it approved is the code that would run now), or None and why the first grant
    found does not hold."""
    void = None
    for grant in await store.match(what.tool, what.rule_key, turn):
        if what.tool != "exec":
            return grant, None
        why = what.once_only if not fingerprint else changed(grant.fingerprint, fingerprint)
        if why is None:
            return grant, None
        void = void or voided(grant, why)
    return None, void
