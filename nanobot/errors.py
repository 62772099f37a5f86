"""The few exception types nanobot raises across module boundaries.

Each carries a message meant for a human; the CLI prints it as is. Library exceptions are
translated into these at the boundary that owns the library (config loading, the store, the
provider), never deeper.
"""

from __future__ import annotations

from typing import Final, Literal


class NanobotError(Exception):
    """Base of every error nanobot raises on purpose."""


class ConfigError(NanobotError):
    """The configuration cannot be used: unreadable file, unknown key, bad value.

    The message names the file, the key path and the reason.
    """


CONFIG_EXIT: Final = 2
"""The exit status of a configuration error, at start or once every channel refused the
credentials it was given: the service managers do not restart it (systemd's
`RestartPreventExitStatus=2`), since the same config would fail again."""


class StoreError(NanobotError):
    """The state database cannot be opened, migrated or written.

    Raised instead of silently recreating or overwriting anything. `storage` is set when
    the failure lies where the data lives (`nanobot.store.failures`), not in the statement.
    """

    storage: bool = False


ProviderErrorKind = Literal[
    "rate_limited", "unavailable", "timeout", "auth", "bad_request", "context_overflow"
]


class ProviderError(NanobotError):
    """A model call failed after retries and fallbacks.

    `kind` says why, for callers that react differently (a context overflow triggers
    compaction; the rest become one short line for the user). `model` is the last model tried.
    `retry_after` is the wait in seconds the server asked for, if it named one.
    The message is for logs; it is never written into a conversation as assistant text.
    """

    def __init__(
        self,
        kind: ProviderErrorKind,
        message: str,
        *,
        model: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: ProviderErrorKind = kind
        self.model = model
        self.retry_after = retry_after

    def user_message(self) -> str:
        """A short, plain line for the person in the chat."""
        return _USER_MESSAGES[self.kind]


_USER_MESSAGES: dict[ProviderErrorKind, str] = {
    "rate_limited": "The model is rate-limiting me right now; please try again in a minute.",
    # Said as it is: the message is not kept to be answered later, so no promise of that.
    "unavailable": (
        "The model is unavailable right now and I could not answer this; please send it again "
        "in a few minutes."
    ),
    "timeout": "The model took too long to answer; please try again.",
    "auth": "I can't reach the model: its API key was refused. Check agent.api_key.",
    "bad_request": "The model refused the request; the details are in the log.",
    "context_overflow": "This conversation no longer fits the model's context window.",
}
