"""The gate: who may talk to nanobot, and the one way in for every accepted message.

Deny by default. A sender is allowed by the channel's `allow_from` (numeric platform ids, or
"*") or by an approved pairing. An unknown sender in a private chat gets a pairing code and
nothing else; in a group they are ignored. Group messages are answered only as the channel's
`group_policy` says. Channels ask `admits` before downloading a message's files, so nothing a
stranger sends is fetched. An allowed message is journaled (recognising redeliveries) and
queued for the agent, in that order, before the channel acknowledges it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from loguru import logger

from nanobot.bus.events import InboundMessage, OutboundMessage
from nanobot.bus.queue import MessageBus
from nanobot.bus.records import inbound_record
from nanobot.channels.base import Intake
from nanobot.log import printable
from nanobot.store import Access, Journal
from nanobot.store.access import MAX_PENDING

GroupPolicy = Literal["mention", "open", "disabled"]


@dataclass(frozen=True, slots=True)
class ChannelRules:
    """The access rules of one channel, from its config section."""

    allow_from: frozenset[str]
    group_policy: GroupPolicy = "mention"

    @property
    def everyone(self) -> bool:
        return "*" in self.allow_from


def pairing_notice(code: str) -> str:
    return (
        "Hi! I only talk to people my owner has approved. To be approved, ask them to run:\n"
        f"nanobot pairing approve {code}\n"
        "(The code is valid for one hour.)"
    )


class Gate:
    """Decides on every inbound message; the `IntakePort` given to channels."""

    def __init__(
        self,
        rules: Mapping[str, ChannelRules],
        access: Access,
        journal: Journal,
        bus: MessageBus,
    ) -> None:
        self._rules = dict(rules)
        self._access = access
        self._journal = journal
        self._bus = bus
        self._closed = False
        self._crowded: set[str] = set()  # channels whose pairing requests push out others

    def close(self) -> None:
        """Stop handing messages to the agent: from now on an allowed message is journaled
        and answered after the restart (Discord never delivers a message twice, so leaving
        it to the platform would lose it). Strangers get no pairing code while stopping:
        their messages are not taken (`Intake.CLOSED`; Telegram delivers them again)."""
        self._closed = True

    def describe(self) -> list[str]:
        """One line per channel saying who may talk to it (for the start-up log)."""
        lines = []
        for name, rules in sorted(self._rules.items()):
            if rules.everyone:
                who = "everyone"
            elif rules.allow_from:
                who = f"{len(rules.allow_from)} allowed user(s) and approved pairings"
            else:
                who = "nobody yet (allow_from is empty): unknown users get a pairing code"
            lines.append(f"{name}: answers {who}; groups: {rules.group_policy}")
        return lines

    async def admits(self, channel: str, sender_id: str, *, private: bool, addressed: bool) -> bool:
        rules = self._rules.get(channel)
        if rules is None or not (private or _listens(rules.group_policy, addressed)):
            return False
        return await self._allowed(rules, channel, sender_id)

    async def __call__(self, message: InboundMessage) -> Intake:
        refusal = await self._check(message)
        if refusal is not None:
            return refusal
        journal_id = await self.submit(message)
        return Intake.DUPLICATE if journal_id is None else Intake.ACCEPTED

    async def submit(self, message: InboundMessage) -> int | None:
        """Journal `message` and queue it for the agent, without asking who sent it: the
        way in for nanobot's own events (`EventIntake`), and for chat messages once they
        passed the checks. Its journal row; None when it was journaled before."""
        journal_id = await self._journal.accept(
            message.chat.channel, message.message_id, inbound_record(message)
        )
        if journal_id is None:
            logger.debug(
                "{} message {} seen before; ignored", message.chat.channel, message.message_id
            )
            return None
        if self._closed:  # checked after the journal write: the gate may close during it
            logger.info(
                "{} message {} arrived while stopping: kept, answered after the restart",
                message.chat.channel,
                message.message_id,
            )
            return journal_id
        await self._bus.publish_inbound(replace(message, journal_id=journal_id))
        return journal_id

    async def _check(self, message: InboundMessage) -> Intake | None:
        """Why `message` is not taken, or None when it may go to the agent."""
        rules = self._rules.get(message.chat.channel)
        if rules is None:
            return self._refuse(message, "unknown channel")
        channel, sender = message.chat.channel, message.sender_id
        if message.is_private:
            if await self._allowed(rules, channel, sender):
                return None
            return Intake.CLOSED if self._closed else await self._pair(message)
        if not _listens(rules.group_policy, message.addressed):
            return Intake.REFUSED  # not talking to us: not even worth a log line
        if not await self._allowed(rules, channel, sender):
            return self._refuse(message, "sender is not allowed")
        return None

    async def _allowed(self, rules: ChannelRules, channel: str, sender_id: str) -> bool:
        if rules.everyone or sender_id in rules.allow_from:
            return True
        return await self._access.is_allowed(channel, sender_id)

    def _refuse(self, message: InboundMessage, why: str) -> Intake:
        logger.info(
            "refused a {} message from user {} in chat {}: {}",
            message.chat.channel,
            message.sender_id,
            message.chat.chat_id,
            why,
        )
        return Intake.REFUSED

    async def _pair(self, message: InboundMessage) -> Intake:
        channel = message.chat.channel
        issued = await self._access.request(
            channel, message.sender_id, message.chat.chat_id, message.sender_name
        )
        if not issued.new:
            return self._refuse(message, f"unknown sender; pairing code {issued.code} already sent")
        self._note_crowding(channel, issued.evicted)
        logger.info(
            "pairing requested on {} by user {} ({}): code {}; approve with "
            "`nanobot pairing approve {}`",
            channel,
            message.sender_id,
            printable(message.sender_name or "no name"),
            issued.code,
            issued.code,
        )
        notice = OutboundMessage(message.chat, pairing_notice(issued.code), kind="notice")
        await self._bus.publish(notice)
        return Intake.PAIRING

    def _note_crowding(self, channel: str, evicted: int) -> None:
        """Warn once when a channel's pairing requests start pushing out older ones, not on
        every request while that lasts: a flood would otherwise flood the log as well."""
        if not evicted:
            self._crowded.discard(channel)
        elif channel not in self._crowded:
            self._crowded.add(channel)
            logger.warning(
                "{}: {} pairing requests are waiting, so each new one now replaces the oldest "
                "(many strangers, or one with many accounts?); see `nanobot pairing list`",
                channel,
                MAX_PENDING,
            )


def _listens(policy: GroupPolicy, addressed: bool) -> bool:
    """Whether a group message is for us under `policy`."""
    return policy == "open" or (policy == "mention" and addressed)
