"""Which transport makes the calls to each model (`agent.transport`), decided without
importing litellm.

`auto` sends a model's calls directly (`openai_direct`) where litellm would send the very
same request, and through litellm otherwise. For nanobot's parameters (`max_tokens`,
`temperature`, `stream_options`, tools) litellm changes the request of an OpenAI model in
exactly two cases, which `litellm_translates` states from litellm's own rules
(`OpenAIConfig.map_openai_params`) and its model list, read without the import:

- the o-series reasoning models it lists (`o1`, `o3-mini`, `o4-mini`, …): `max_tokens`
  becomes `max_completion_tokens` and `temperature` is dropped;
- any model whose name holds `gpt-5` or `gpt-6` (but not `gpt-5-chat`): the same, and some
  calls go to the Responses API instead.

Every other `openai/` model, listed or not (a local server's own model names too), gets the
parameters as given. `tests/test_provider_routes.py` checks this rule against litellm's own
answer for every model in the list and for names it does not have.
"""

from __future__ import annotations

from loguru import logger

from nanobot.providers.base import Transport
from nanobot.providers.catalog import Catalog

OPENAI = "openai"
_REASONING_SERIES = ("gpt-5", "gpt-6")  # litellm's GPT_REASONING_SERIES_MARKERS


def litellm_translates(model: str, catalog: Catalog) -> bool:
    """Whether litellm would change nanobot's parameters for the OpenAI-compatible `model`
    (an `openai/…` id): True for the reasoning models above."""
    name = model.removeprefix(f"{OPENAI}/")
    last = name.split("/")[-1]
    if len(last) > 1 and last[0] == "o" and last[1].isdigit() and _listed(last, catalog):
        return True
    return any(marker in name for marker in _REASONING_SERIES) and "gpt-5-chat" not in last


def _listed(name: str, catalog: Catalog) -> bool:
    """Whether litellm counts `name` among OpenAI's chat models (its list says OpenAI's,
    and it is not a fine-tune id such as `ft:gpt-4o`)."""
    finetune = name.startswith("ft:") and name.count(":") <= 1
    return not finetune and catalog.provider(name) == OPENAI


class Routes:
    """The transport of each model's calls.

    `Routes(t)`: `t` for every model. `Routes.auto(litellm, direct, catalog)`: `direct` for
    the `openai/` models litellm would send unchanged (decided once per model, and logged),
    `litellm` for every other. Deciding never imports litellm.
    """

    def __init__(self, transport: Transport) -> None:
        self._default = transport
        self._direct: Transport | None = None
        self._catalog: Catalog | None = None
        self._chosen: dict[str, Transport] = {}

    @classmethod
    def auto(cls, litellm: Transport, direct: Transport, catalog: Catalog) -> Routes:
        routes = cls(litellm)
        routes._direct, routes._catalog = direct, catalog
        return routes

    def transport(self, model: str) -> Transport:
        """The transport of `model`'s calls (cheap: a lookup in litellm's list at most)."""
        if self._direct is None or self._catalog is None:
            return self._default
        chosen = self._chosen.get(model)
        if chosen is None:
            direct = model.startswith(f"{OPENAI}/") and not litellm_translates(model, self._catalog)
            chosen = self._chosen[model] = self._direct if direct else self._default
            how = "directly" if direct else "through litellm"
            logger.info("model {}: calls go {} (agent.transport: auto)", model, how)
        return chosen

    async def aclose(self) -> None:
        for transport in {id(t): t for t in (self._default, self._direct) if t}.values():
            await transport.aclose()
