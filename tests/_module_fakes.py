"""The fakes a module's one gateway talks to, made once per module (`module_fake`): the
tests sharing a gateway (an `xdist_group` each) share its fakes too."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import pytest_asyncio

T = TypeVar("T")


def module_fake(name: str, make: Callable[[], AbstractAsyncContextManager[T]]) -> Any:
    """A fixture `name`, of module scope on the module's event loop: the fake `make()`
    opens, closed after the module's last test. Assign it in the module: `llm =
    module_fake("llm", FakeLLM)`."""

    @pytest_asyncio.fixture(scope="module", loop_scope="module", name=name)
    async def fixture() -> AsyncIterator[T]:
        async with make() as fake:
            yield fake

    return fixture
