"""Going on with a session's turn that a restart cut short: its stored answer if it had
finished, else a result for every tool call it left without one."""

from __future__ import annotations

from collections.abc import Mapping

from nanobot.agent.history import repair
from nanobot.agent.run import RunResult
from nanobot.store import NewEntry, SessionStore


async def finished_answer(sessions: SessionStore, session_id: int) -> RunResult | None:
    """The stored final answer if the session's last turn completed, else None."""
    last = await sessions.tail(session_id, 1)
    if not last or last[0].kind != "message":
        return None
    message = last[0].data
    if message.get("role") != "assistant" or message.get("tool_calls"):
        return None
    text = str(message.get("content") or "")
    run_id = last[0].run_id or ""
    return RunResult(run_id, "", "completed", text, final_message=message)


async def record_interrupted(
    sessions: SessionStore, session_id: int, restarted: Mapping[str, str]
) -> None:
    """Store a result for every tool call a restart left without one: what `restarted`
    says for a call (by its id; an approval that was still asked), else "interrupted"."""
    recent = [e.data for e in await sessions.tail(session_id, 50) if e.kind == "message"]
    repaired = repair(recent)
    # Only calls at the very end are ours to settle: the crash interrupted the last turn.
    if repaired[: len(recent)] == recent and len(repaired) > len(recent):
        missing = [
            {**m, "content": restarted[m["tool_call_id"]]}
            if m.get("tool_call_id") in restarted
            else m
            for m in repaired[len(recent) :]
        ]
        await sessions.append(session_id, [NewEntry("message", m) for m in missing])
