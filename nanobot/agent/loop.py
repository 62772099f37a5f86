"""The stateful shell around model calls: sessions in, replies out."""

from __future__ import annotations

from datetime import datetime, tzinfo

from nanobot.agent.context import ContextBuilder, user_message
from nanobot.providers.base import LLMProvider
from nanobot.store import NewEntry, SessionStore

HISTORY_ENTRIES = 200


class AgentLoop:
    """Answers messages in sessions, appending every entry to the store as it happens."""

    def __init__(
        self,
        provider: LLMProvider,
        sessions: SessionStore,
        context: ContextBuilder,
        *,
        timezone: tzinfo | None = None,
    ) -> None:
        self._provider = provider
        self._sessions = sessions
        self._context = context
        self._timezone = timezone

    async def ask(self, session_key: str, text: str) -> str:
        """Run one turn in the session named `session_key` and return the reply text.

        The user's message is stored before the model is called; the reply after it arrives.

        Raises:
            ProviderError: the model could not be reached; nothing is stored for the reply.
            StoreError: the session could not be read or written.
        """
        session_id = await self._sessions.live(session_key)
        message = user_message(text, datetime.now(self._timezone).astimezone(self._timezone))
        await self._sessions.append(session_id, [NewEntry("message", message)])
        history = await self._sessions.tail(session_id, HISTORY_ENTRIES)
        completion = await self._provider.complete(self._context.messages(history))
        await self._sessions.append(session_id, [NewEntry("message", completion.to_message())])
        return completion.content or ""
