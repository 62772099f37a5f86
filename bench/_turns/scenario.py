"""What the benchmark measures and how much: targets, rounds, the model and the messages."""

from __future__ import annotations

from tests.fakes.llm import Call

PLAIN_TARGET_MS = 3.0
TOOL_TARGET_MS = 6.0
LONG_TARGET_X = 1.2

WARMUP_ROUNDS, ROUNDS = 10, 100  # empty sessions, fake in its own process
LOCAL_WARMUP_ROUNDS, LOCAL_ROUNDS = 5, 60  # the same with the fake in this process
LONG_WARMUPS, LONG_ROUNDS = 5, 50  # 10,000-entry session against empty sessions
# The same with the default transport (auto: direct here) alone: its turns take ~3 ms, so
# many rounds are cheap.
DIRECT_WARMUPS, DIRECT_ROUNDS = 20, 300
COLD_STARTS = 7  # first turn after start-up (fresh `_parts`), long and empty session
PROFILE_TURNS, PROFILE_LONG_TURNS, PROFILE_LONG_CALLS = 50, 10, 10
KEEP_REQUESTS = 16  # requests the fake in its own process keeps for `bodies()`
MICRO_RUNS = 300
ATTRIBUTION_ROUNDS = 200  # at most, for the profile's attribution to packages
LONG_ENTRIES, PREFILL_BATCH = 10_000, 500
SETTLE_LIMIT_S = 2.0  # longest wait for the tasks a measured call started
PAUSE_S = 0.001  # between measured items: lets litellm's thread-pool work finish
SEED = 3

MODEL = "openai/fake-model"
# The same OpenAI-compatible endpoint through litellm's own HTTP handler, not the openai SDK.
ROUTE_MODEL = "hosted_vllm/fake-model"
MESSAGE = "What is on my calendar tomorrow?"
TOOL_MESSAGE = "What do you know about me? Look it up in USER.md."
TOOL_CALL = Call("read_file", {"path": "USER.md"})
SUMMARY = (
    "The user plans their week with the assistant: reminders (dentist, passport renewal), "
    "shopping lists, train trips between Berlin, Hamburg and Munich, and bills (electricity "
    "paid, internet due on the 28th). They prefer short answers and metric units. Open: book "
    "the Munich train for the 14th; draft the note to Sam about the project review."
)
# What the fake answers, in its JSON form (tests/fakes/llm.py).
TOOL_REPLY = {"type": "ToolCalls", "calls": [vars(TOOL_CALL)]}
ECHO_REPLY = {"type": "Echo"}
