"""End to end: `nanobot gateway` with a damaged state database, as a subprocess with the fake
Telegram: it refuses to start before it acknowledges anything, and says how to restore."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.fakes.llm import FakeLLM, Text
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import GatewayProcess
from tests.test_gateway_telegram import ALICE, gateway_config, replies
from tests.test_store_sqlite import filled, overwrite

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)


async def test_a_damaged_database_stops_the_start_before_anything_is_acknowledged(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    async with FakeTelegram(token=DEFAULT_TOKEN) as telegram:
        config = gateway_config(tmp_path, fake_llm, telegram)
        state = Path(config["data_dir"]) / "state.db"
        await filled(state)
        overwrite(state, "entries")
        telegram.user_message(ALICE, "are you there?", user_id=ALICE)
        process = GatewayProcess(tmp_path, config, dict(os.environ))

        await process.start(ready="is damaged")
        assert process.process is not None
        assert await asyncio.wait_for(process.process.wait(), 30) == 1
        await process.stop()
        log = process.log()
        assert f"nanobot: {state} is damaged; SQLite's quick check found:" in log
        assert "table entries: database disk image is malformed" in log
        assert "put back a backup of state.db, or move it aside" in log
        assert "telegram connected" not in log
        assert telegram.calls("getUpdates") == []  # not even asked, so nothing acknowledged
        assert len(telegram.pending_updates) == 1

        # Moved aside as the message says: a fresh start answers what was waiting.
        state.rename(state.with_name("state.db.damaged"))
        fake_llm.script(Text("Yes, here."))
        await process.start(ready="telegram connected")
        try:
            assert await replies(telegram, ALICE, 1) == ["Yes, here."]
            await telegram.wait_for(lambda: not telegram.pending_updates)
        finally:
            await process.stop()
