"""An approval request's cards in the chats: where they go, posted through the outbox, and
edited to say what became of the request (their text is `approval_cards`').

A card goes to each decider's private chat (in a group, with a note in the group), named the
same way for the card and its later edits: one delivery lane, so the edit never overtakes
the card.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from nanobot.agent.approval_cards import buttons, card_text, decided_text
from nanobot.agent.approvals import AskApprovers, AskHere, decision_text
from nanobot.bus.events import Button, ChatRef, OutboundMessage
from nanobot.bus.queue import MessageBus
from nanobot.bus.records import outbound_record
from nanobot.store import ApprovalRequest, ApprovalStore, Journal
from nanobot.store.approvals import Place


def placing(
    where: AskHere | AskApprovers, chat: ChatRef, user_id: str | None, *, private: bool
) -> tuple[tuple[str, ...], list[Place]]:
    """Who decides a request asked in `chat` (by `user_id`), and where its cards go: each
    decider's private chat, then, in a group (not `private`), the group for the note."""
    if isinstance(where, AskHere):
        deciders = tuple(where.deciders)
        cards = [ChatRef.direct(chat.channel, user_id or deciders[0])]
    else:
        deciders = tuple(where.approvers)
        cards = [ChatRef.direct(chat.channel, a) for a in where.approvers]
    places = [Place(c.channel, c.chat_id) for c in cards]
    if not private:
        places.append(Place(chat.channel, chat.chat_id))
    return deciders, places


class Cards:
    """Posts and edits the cards of requests kept in `store`, as outbound records of
    `journal`, handed to `bus`."""

    def __init__(
        self, store: ApprovalStore, journal: Journal, bus: MessageBus, *, workspace: Path
    ) -> None:
        self._store = store
        self._journal = journal
        self._bus = bus
        self._workspace = workspace

    async def ask(
        self,
        request: ApprovalRequest,
        places: Sequence[Place],
        *,
        group: ChatRef | None,
        once_only: str | None,
        host: str | None = None,
    ) -> None:
        """Post `request`'s card with its buttons in each decider's place (`placing`), and,
        asked in `group`, the note there (the last of `places`). `host`: a fetch's, whose
        "always" holds for that host only."""
        always = None if host is None else f"for this host: {host}, in your turns, without asking"
        text = card_text(request, workspace=self._workspace, once_only=once_only, always=always)
        keys = buttons(request, always_label="Always allow" if host is None else "Always for host")
        cards = places[:-1] if group is not None else places
        for place in cards:
            await self._post(request, place, ChatRef(place.channel, place.chat_id), text, keys)
        if group is not None:
            call = request.asked.tool
            note = f"Waiting for an approver to decide on running {call} ({request.id})."
            await self._post(request, places[-1], group, note, ())

    async def _post(
        self,
        request: ApprovalRequest,
        place: Place,
        chat: ChatRef,
        text: str,
        keys: tuple[Button, ...],
    ) -> None:
        card = OutboundMessage(chat, text, kind="card", buttons=keys)
        outbox_id = await self._journal.enqueue(chat.channel, outbound_record(card))
        await self._store.card_sent(request.id, place, str(outbox_id))
        await self._bus.publish(replace(card, outbox_id=outbox_id))

    async def show(self, request: ApprovalRequest) -> None:
        """Edit every card of `request` to say what became of it, without buttons."""
        asked = request.asked
        text = decided_text(request, decision_text(request))
        for place in asked.places:
            if place.message_id is None or not place.message_id.isdigit():
                continue
            card = int(place.message_id)
            if await self._journal.sent_id(card) is None:
                # Not out yet (or cut off by a crash before it was recorded): it must not
                # go out now, with buttons for what is decided; the decision goes instead.
                await self._journal.give_up(card, "decided before the card was shown")
            chat = ChatRef(place.channel, place.chat_id)
            edit = OutboundMessage(chat, text, kind="card", edits=card)
            outbox_id = await self._journal.enqueue(chat.channel, outbound_record(edit))
            await self._bus.publish(replace(edit, outbox_id=outbox_id))
