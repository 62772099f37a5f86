"""The CLI as a user runs it: real subprocesses, a fake model server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import zipfile
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest

from nanobot.store import Access, Database, Journal
from nanobot.store.access import MAX_PENDING
from tests.conftest import Home
from tests.fakes.llm import AuthError, FakeLLM, ServerError, Text
from tests.test_store_sqlite import filled, overwrite, skip_index
from tests.test_terminal import piped

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)

SECRET = "sk-test-secret-key-123456"


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str


async def nanobot(
    home: Home, *args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> Result:
    """`nanobot *args` in a subprocess; `prefix` is a command it runs under (`setpriv …`)."""
    process = await asyncio.create_subprocess_exec(
        *prefix,
        sys.executable,
        "-m",
        "nanobot",
        *args,
        env=env or home.env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode is not None
    return Result(process.returncode, stdout.decode(), stderr.decode())


async def test_agent_message_prints_only_the_reply(home: Home, fake_llm: FakeLLM) -> None:
    fake_llm.script(Text("Hello! How can I help?"))
    result = await nanobot(home, "agent", "-m", "hi there")
    assert result.code == 0, result.stderr
    assert result.stdout == "Hello! How can I help?\n"
    request = fake_llm.requests[0]
    assert request.model == "fake-model"
    assert request.messages[0]["role"] == "system"
    assert request.messages[-1]["role"] == "user"
    assert request.messages[-1]["content"].endswith("hi there")
    # The workspace was laid down and its instructions reached the model.
    assert (home.data_dir / "workspace" / "AGENTS.md").exists()
    assert "Agent instructions" in request.messages[0]["content"]


async def test_session_continues_with_the_same_name(home: Home, fake_llm: FakeLLM) -> None:
    fake_llm.script(Text("Nice to meet you, Ada."), Text("You are Ada."), Text("Who?"))
    assert (await nanobot(home, "agent", "-m", "I am Ada", "-s", "cli:ada")).code == 0
    second = await nanobot(home, "agent", "-m", "Who am I?", "-s", "cli:ada")
    assert second.stdout == "You are Ada.\n"
    history = fake_llm.requests[1].messages
    assert [m["role"] for m in history] == ["system", "user", "assistant", "user"]
    assert history[2]["content"] == "Nice to meet you, Ada."
    # Another session does not see that conversation.
    await nanobot(home, "agent", "-m", "Who am I?", "-s", "cli:other")
    assert [m["role"] for m in fake_llm.requests[2].messages] == ["system", "user"]


async def test_default_session_is_cli_default(home: Home, fake_llm: FakeLLM) -> None:
    await nanobot(home, "agent", "-m", "one")
    await nanobot(home, "agent", "-m", "two", "-s", "cli:default")
    assert len(fake_llm.requests[1].messages) == 4


async def test_unreachable_model_exits_non_zero_with_one_line(home: Home) -> None:
    env = dict(home.env)
    env["NANOBOT_AGENT__API_BASE"] = "http://127.0.0.1:9/v1"
    env["NANOBOT_AGENT__MAX_RETRIES"] = "1"
    result = await nanobot(home, "agent", "-m", "hi", env=env)
    assert result.code != 0
    assert result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("nanobot: The model is unavailable right now")
    assert SECRET not in result.stderr


async def test_provider_failure_is_not_stored_as_history(home: Home, fake_llm: FakeLLM) -> None:
    env = dict(home.env)
    env["NANOBOT_AGENT__MAX_RETRIES"] = "0"
    fake_llm.script(ServerError(500), Text("back again"))
    assert (await nanobot(home, "agent", "-m", "first", env=env)).code != 0
    assert (await nanobot(home, "agent", "-m", "second", env=env)).stdout == "back again\n"
    roles = [m["role"] for m in fake_llm.requests[1].messages]
    # The failed turn left its user message and no made-up assistant answer.
    assert roles == ["system", "user", "user"]


async def test_onboard_twice_changes_nothing(home: Home) -> None:
    config = home.root / "fresh" / "config.yaml"
    env = dict(home.env, NANOBOT_CONFIG=str(config), NANOBOT_DATA_DIR=str(home.root / "d"))
    first = await nanobot(home, "onboard", "--non-interactive", env=env)
    assert first.code == 0, first.stderr
    assert "wrote" in first.stdout
    assert config.stat().st_mode & 0o777 == 0o600
    files = sorted(p for p in (home.root / "d").rglob("*") if p.is_file())
    assert {p.name for p in files} >= {"AGENTS.md", "SOUL.md", "USER.md", "MEMORY.md"}
    (home.root / "d" / "workspace" / "USER.md").write_text("my own notes", encoding="utf-8")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in [config, *files]}
    second = await nanobot(home, "onboard", "--non-interactive", env=env)
    assert second.code == 0
    assert "exists" in second.stdout
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in [config, *files]}
    assert after == before


async def test_onboard_refuses_an_invalid_existing_config(home: Home) -> None:
    home.write_config("agent: {bogus: 1}\n")
    result = await nanobot(home, "onboard", "--non-interactive")
    assert result.code == 2
    assert "agent.bogus: unknown key" in result.stderr


async def test_bad_config_exits_2_with_file_and_key(home: Home) -> None:
    home.write_config("agent:\n  max_tokens: plenty\n")
    for command in (["status"], ["agent", "-m", "hi"], ["gateway"]):
        result = await nanobot(home, *command)
        assert result.code == 2, command
        assert str(home.config) in result.stderr
        assert "agent.max_tokens" in result.stderr


async def test_status_shows_figures_and_no_secrets(home: Home, fake_llm: FakeLLM) -> None:
    home.write_config(
        home.config.read_text()
        + "channels:\n  telegram: {enabled: true, token: '123:tg-secret', allow_from: [1, 2]}\n"
    )
    await nanobot(home, "agent", "-m", "hi")
    result = await nanobot(home, "status")
    assert result.code == 0, result.stderr
    assert str(home.config) in result.stdout
    assert "openai/fake-model via http://127.0.0.1:" in result.stdout
    assert "(direct)" in result.stdout  # the transport
    assert "enabled, 2 allowed" in result.stdout
    assert "1 (1 live), 2 entries" in result.stdout
    for secret in (SECRET, "tg-secret"):
        assert secret not in result.stdout + result.stderr


async def test_status_shows_replies_the_platforms_refused(home: Home) -> None:
    async with await Database.open(home.data_dir / "state.db") as db:
        assert "none failed" in (await nanobot(home, "status")).stdout
        journal = Journal(db)
        for text in ("one", "two"):
            outbox_id = await journal.enqueue("telegram", {"text": text})
            await journal.give_up(outbox_id, f"sendMessage: Forbidden: bot was blocked ({text})")
    result = await nanobot(home, "status")
    assert result.code == 0, result.stderr
    assert "2 failed in the last 7 days; latest at " in result.stdout
    assert "bot was blocked (two)" in result.stdout


async def test_status_and_pairing_list_show_who_waits_without_terminal_tricks(
    home: Home,
) -> None:
    forged = "Eve\x1b[2J\nApproved users:\u202e"
    async with await Database.open(home.data_dir / "state.db") as db:
        access = Access(db)
        await access.request("telegram", "7", "7", forged)
        for user in range(MAX_PENDING):
            await access.request("discord", str(user), str(user), None)
    status = await nanobot(home, "status")
    assert status.code == 0, status.stderr
    [line] = [line for line in status.stdout.splitlines() if line.startswith("pairing")]
    assert f"{MAX_PENDING + 1} request(s) waiting" in line
    assert f"discord {MAX_PENDING} (full: a new one replaces the oldest)" in line
    assert "telegram 1," in line or "telegram 1;" in line
    listing = await nanobot(home, "pairing", "list")
    assert listing.code == 0, listing.stderr
    assert "\x1b" not in listing.stdout and "\u202e" not in listing.stdout
    assert "(Eve\\x1b[2J\\nApproved users:\\u202e)" in listing.stdout
    assert listing.stdout.count("Approved users:") == 2  # the heading, and the name escaped
    assert len(listing.stdout.splitlines()) == MAX_PENDING + 6  # headings, and two "none"


async def test_pairing_list_names_who_the_config_lets_in_and_times_with_their_zone(
    home: Home,
) -> None:
    home.write_config(
        home.config.read_text(encoding="utf-8") + "timezone: Europe/Berlin\n"
        "channels:\n"
        "  telegram: {enabled: true, token: '123456:ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghi', "
        "allow_from: [1, 2]}\n"
        "  discord: {enabled: true, token: x, allow_from: ['*']}\n"
    )
    async with await Database.open(home.data_dir / "state.db") as db:
        await Access(db).request("telegram", "7", "7", "Eve")
    listing = await nanobot(home, "pairing", "list")
    assert listing.code == 0, listing.stderr
    lines = listing.stdout.splitlines()
    [waiting] = [line for line in lines if "telegram user 7 (Eve), until " in line]
    assert waiting.endswith((" CET", " CEST"))  # the configured zone, named
    start = lines.index("Allowed by the config (allow_from):")
    assert lines[start + 1 : start + 3] == ["  telegram: 1, 2", "  discord: everyone"]


async def test_secrets_never_reach_the_log_file(home: Home, fake_llm: FakeLLM) -> None:
    env = dict(home.env, NANOBOT_LOG__LEVEL="DEBUG")
    result = await nanobot(home, "agent", "-m", "hi", "--verbose", env=env)
    assert result.code == 0
    log_text = (home.data_dir / "logs" / "nanobot.log").read_text()
    assert log_text  # debug logging did write something
    assert SECRET not in log_text + result.stderr


async def test_quick_commands_import_no_heavy_library(home: Home) -> None:
    probe = (
        "import sys\n"
        "from nanobot.cli import app\n"
        "for args in (['--help'], ['status'], ['onboard', '--non-interactive']):\n"
        "    try:\n"
        "        app(args)\n"
        "    except SystemExit as exc:\n"
        "        assert not exc.code, (args, exc.code)\n"
        "heavy = ('litellm', 'telegram', 'discord', 'openai')\n"
        "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import json\n" + probe,
        env=home.env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()
    assert json.loads(stdout.decode().strip().splitlines()[-1]) == []


async def test_version_and_help(home: Home) -> None:
    version = await nanobot(home, "--version")
    assert version.code == 0
    assert version.stdout.startswith("nanobot 0.")
    help_text = (await nanobot(home, "--help")).stdout
    for command in ("onboard", "status", "agent", "gateway", "--config"):
        assert command in help_text


def test_console_script_is_declared() -> None:
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert 'nanobot = "nanobot.cli:main"' in text


async def test_interactive_chat_reads_lines_until_exit(home: Home, fake_llm: FakeLLM) -> None:
    fake_llm.script(Text("first answer"), Text("second answer"))
    code, out, err = await piped(home, b"one\n\ntwo\n/exit\nnever sent\n")
    assert code == 0
    assert out.splitlines() == ["first answer", "second answer"], err
    assert fake_llm.request_count == 2


async def test_wheel_ships_the_workspace_template_and_example(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--quiet",
        "-w",
        str(tmp_path),
        str(root),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, stderr.decode()
    (wheel,) = tmp_path.glob("nanobot-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for name in ("AGENTS.md", "SOUL.md", "USER.md", "TOOLS.md", "HEARTBEAT.md", "memory/MEMORY.md"):
        assert f"nanobot/workspace_template/{name}" in names
    assert "nanobot/config.example.yaml" in names


async def test_an_error_quoting_the_key_is_printed_without_it(
    home: Home, fake_llm: FakeLLM
) -> None:
    # Some providers echo the key they refused; the one-line reason must not.
    # (litellm's transport quotes the server's message.)
    text = home.config.read_text().replace("  transport: direct", "  transport: litellm")
    home.write_config(text)
    fake_llm.script(AuthError())
    result = await nanobot(home, "agent", "-m", "hi")
    assert result.code == 1
    assert "API key" in result.stderr
    assert SECRET not in result.stderr + result.stdout


async def _approval(db: Database, command: str, verdict: str | None) -> str:
    """A request for `command` in telegram chat 42, answered with `verdict` (None: waiting)."""
    from datetime import timedelta
    from typing import cast

    from nanobot.agent.approvals import new_request, subject
    from nanobot.store import ApprovalStore
    from nanobot.store.approvals import Place, Verdict

    store = ApprovalStore(db)
    call = subject("exec", {"command": command})
    new = new_request(
        call,
        session_key="telegram:42",
        run_id="run",
        tool_call_id="call",
        reason="exec asks first",
        deciders=["42"],
        places=[Place("telegram", "42")],
        owner="42",
    )
    request = await store.create(new, expires_in=timedelta(minutes=10))
    if verdict is not None:
        decision = await store.decide(
            request.id, cast(Verdict, verdict), by="42", channel="telegram", chat_id="42"
        )
        assert decision.won
    return request.id


async def test_approvals_rules_revoke_pending_and_log(home: Home) -> None:
    from nanobot.store import ApprovalStore

    # Nothing yet: every listing says so, and the database is made on the way.
    empty = await nanobot(home, "approvals", "rules")
    assert (empty.code, empty.stdout) == (
        0,
        'No saved rules. "Always allow" on an approval card saves one.\n',
    )
    assert (await nanobot(home, "approvals", "pending")).stdout.startswith("No requests")
    assert (await nanobot(home, "approvals", "log")).stdout == "No decisions yet.\n"
    forged = "ls\x1b[2J\nRevoked rule 00000000"
    async with await Database.open(home.data_dir / "state.db") as db:
        await _approval(db, "git   status", "always")
        await _approval(db, forged, "always")
        waiting = await _approval(db, "make test", None)
        await _approval(db, "rm -rf build", "deny")
        rules = await ApprovalStore(db).rules()
    git_rule = next(rule for rule in rules if rule.rule_key == "git status")

    listing = await nanobot(home, "approvals", "rules")
    assert listing.code == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split() == ["ID", "TOOL", "SAVED", "BY", "FOR", "CALL"]
    assert len(lines) == 3  # the heading and two rules, each on one line
    assert any(git_rule.id in line and "git   status" in line for line in lines)
    assert all("telegram user 42's own turns" in line for line in lines[1:])
    assert "\x1b" not in listing.stdout and "ls\\x1b[2J\\nRevoked rule 00000000" in listing.stdout

    pending = await nanobot(home, "approvals", "pending")
    assert pending.code == 0
    [row] = [line for line in pending.stdout.splitlines() if line.startswith(waiting)]
    assert "telegram:42" in row and "make test" in row
    assert "/approve ID" in pending.stdout

    revoked = await nanobot(home, "approvals", "revoke", git_rule.id.upper())
    assert (revoked.code, revoked.stdout) == (0, f"Revoked rule {git_rule.id}: exec git   status\n")
    again = await nanobot(home, "approvals", "revoke", git_rule.id)
    assert again.code == 1
    assert "No saved rule has the id" in again.stdout
    assert len((await nanobot(home, "approvals", "rules")).stdout.splitlines()) == 2

    log = await nanobot(home, "approvals", "log")
    assert log.code == 0
    rows = log.stdout.splitlines()[1:]
    expected = ["approved (always)", "approved (always)", "denied", "revoked"]
    assert [next(o for o in expected if f"  {o}  " in row) for row in rows] == expected
    assert "rm -rf build" in rows[2] and "git   status" in rows[3] and "cli" in rows[3]
    latest = await nanobot(home, "approvals", "log", "--limit", "1")
    assert len(latest.stdout.splitlines()) == 2 and "revoked" in latest.stdout


async def test_approvals_help_and_usage_errors(home: Home) -> None:
    help_text = (await nanobot(home, "approvals", "--help")).stdout
    for command in ("rules", "revoke", "pending", "log"):
        assert command in help_text
    assert (await nanobot(home, "approvals", "revoke")).code == 2
    assert (await nanobot(home, "approvals", "log", "--limit", "0")).code == 2


async def test_status_checks_the_state_database_and_check_db_runs_the_full_check(
    home: Home,
) -> None:
    path = home.data_dir / "state.db"
    await filled(path)
    result = await nanobot(home, "status", "--check-db")
    assert result.code == 0, result.stderr
    assert "integrity  ok (full check)" in result.stdout

    # Rows missing from an index: pages are well formed, only the full check notices.
    skip_index(path, "entries_session_id", on=True)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(
            "INSERT INTO entries (session_id, kind, data, created_at)"
            " VALUES (1, 'message', '{}', '2025-01-01')"
        )
        conn.commit()
    skip_index(path, "entries_session_id", on=False)
    result = await nanobot(home, "status")
    assert result.code == 0, result.stderr
    assert "ok (quick check; --check-db for the full one)" in result.stdout
    result = await nanobot(home, "status", "--check-db")
    assert result.code == 1
    assert result.stderr.startswith(f"nanobot: {path} is damaged; SQLite's full check found:\n")
    assert "row 51 missing from index entries_session_id" in result.stderr
    assert "put back a backup of state.db, or move it aside" in result.stderr

    # A table's pages overwritten: every command refuses the file, before writing anything.
    overwrite(path, "entries")
    before = path.read_bytes()
    result = await nanobot(home, "status")
    assert result.code == 1
    assert "quick check found:\n  table entries: database disk image is malformed" in (
        result.stderr
    )
    result = await nanobot(home, "pairing", "approve", "ABCDEFGH")
    assert result.code == 1
    assert "table entries: database disk image is malformed" in result.stderr
    assert path.read_bytes() == before


async def test_taint_list_and_clear(home: Home) -> None:
    from nanobot.store.taint import TaintStore

    empty = await nanobot(home, "taint", "list")
    assert (empty.code, empty.stdout) == (0, "No file is marked as holding content from outside.\n")
    async with await Database.open(home.data_dir / "state.db") as db:
        store = TaintStore(db)
        await store.mark(
            ["memory/MEMORY.md"], "written by a turn that had read https://x/", replace=True
        )
        await store.mark(["notes\x1b[2J.md"], "received in a chat", replace=True)
    listing = await nanobot(home, "taint", "list")
    assert listing.code == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert header.split() == ["PATH", "MARKED", "SESSION", "WHERE", "FROM"]
    assert rows[0].startswith("memory/MEMORY.md ")
    assert rows[0].endswith("written by a turn that had read https://x/")
    assert "\x1b" not in listing.stdout  # a forged name cannot move the cursor
    cleared = await nanobot(home, "taint", "clear", "memory/MEMORY.md")
    assert cleared.code == 0, cleared.stderr
    async with await Database.open(home.data_dir / "state.db") as db:
        assert [m.path for m in await TaintStore(db).all()] == ["notes\x1b[2J.md"]


async def test_agent_message_keeps_stderr_quiet_and_the_log_file_at_log_level(
    home: Home, fake_llm: FakeLLM
) -> None:
    fake_llm.script(Text("Logged."))
    env = dict(home.env, NANOBOT_LOG__LEVEL="DEBUG")
    result = await nanobot(home, "agent", "-m", "hi", env=env)
    assert (result.code, result.stdout, result.stderr) == (0, "Logged.\n", "")
    written = (home.data_dir / "logs" / "nanobot.log").read_text(encoding="utf-8")
    assert "| DEBUG " in written  # log.level holds for the file, whatever -m keeps off stderr


async def test_h_is_help_everywhere_and_an_empty_message_costs_no_model_call(
    home: Home, fake_llm: FakeLLM
) -> None:
    for command in ((), ("agent",), ("pairing", "approve")):
        shown = await nanobot(home, *command, "-h")
        assert shown.code == 0 and shown.stdout.startswith("Usage: "), (command, shown.stderr)
    for blank in ("", "   "):
        result = await nanobot(home, "agent", "-m", blank)
        assert (result.code, result.stderr) == (2, "nanobot: -m needs a message: it is empty\n")
    assert fake_llm.request_count == 0


async def test_memory_search_finds_what_was_said_and_refuses_a_query_without_words(
    home: Home, fake_llm: FakeLLM
) -> None:
    fake_llm.script(Text("Herons nest in tall trees near water."))
    said = await nanobot(home, "agent", "-m", "Where do herons nest?", "-s", "cli:birds")
    assert said.code == 0, said.stderr
    found = await nanobot(home, "memory", "search", "herons nest")
    assert found.code == 0, found.stderr
    lines = found.stdout.splitlines()
    assert len(lines) == 3, found.stdout  # a heading, then the hits with the matches marked
    assert "cli:birds · user: Where do **herons nest**?" in found.stdout
    assert "assistant: **Herons nest** in tall trees near water." in found.stdout
    nothing = await nanobot(home, "memory", "search", "penguins")
    assert nothing.code == 0 and "herons" not in nothing.stdout.lower()
    refused = await nanobot(home, "memory", "search", '"*"')
    assert refused.code != 0 and refused.stdout == ""
    assert "no words to search for" in refused.stderr
