"""Where a call that needs approval is asked and who may decide it, or that nobody can and
it is refused at once: `route(origin, approvers, …)`. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

Unattended = Literal["ask", "deny"]
"""What a cron job's or the heartbeat's call that needs approval gets."""


@dataclass(frozen=True, slots=True)
class Origin:
    """The chat a call comes from. `user_id` is who is talking (in a private chat, its one
    user; None when not known); `unattended` for cron jobs and the heartbeat, whose chat is
    the one they deliver to."""

    channel: str
    chat_id: str
    private: bool
    user_id: str | None
    unattended: bool = False


@dataclass(frozen=True, slots=True)
class AskHere:
    """Ask in the origin chat; `deciders` may decide."""

    deciders: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AskApprovers:
    """Ask each approver in their private chat (and say in the origin chat that it waits)."""

    approvers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RefuseNow:
    """Nobody can decide: refuse the call at once; `reason` says why and what to configure."""

    reason: str


Route = AskHere | AskApprovers | RefuseNow


def route(
    origin: Origin | None, approvers: Collection[str], *, unattended: Unattended = "ask"
) -> Route:
    """Where a request for a call from `origin` is asked and who decides it, given its
    channel's configured `approvers` (`channels.<name>.approvers`).

    Configured approvers decide everywhere: in the private chat of one of them, there; else
    each in their own private chat. With none configured, the user talking in a private chat
    decides, and in a group nobody can. An unattended turn asks like its delivery chat would
    (unless `unattended` is "deny"): its `origin` is private only where that chat is named for
    its user; one that delivers nowhere (`origin` None) is refused.
    """
    if origin is not None and origin.unattended and unattended == "deny":
        return RefuseNow(
            "calls that need approval are refused in scheduled and heartbeat turns"
            " (tools.approval.unattended: deny)"
        )
    if origin is None:
        return RefuseNow("nobody can approve it: this turn delivers to no chat")
    ordered = tuple(dict.fromkeys(approvers))
    if not ordered:
        return _without_approvers(origin)
    if origin.private and origin.user_id in ordered:
        return AskHere(ordered)
    return AskApprovers(ordered)


def _without_approvers(origin: Origin) -> Route:
    if origin.private and origin.user_id:
        return AskHere((origin.user_id,))
    setting = f"channels.{origin.channel}.approvers"
    if origin.unattended:
        return RefuseNow(
            "nobody can approve it: a scheduled or heartbeat turn asks the user whose private"
            f" chat it delivers to, named `@<user id>` ({origin.channel} chat {origin.chat_id}"
            f" is not); add your {origin.channel} user id to {setting} in the config and"
            " restart nanobot"
        )
    if origin.private:
        return RefuseNow(f"nobody can approve it here: add an approver's user id to {setting}")
    return RefuseNow(
        f"only an approver can allow this in a group, and {setting} is empty: add your"
        f" {origin.channel} user id there in the config and restart nanobot"
    )
