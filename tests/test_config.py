from __future__ import annotations

import itertools
import stat
from pathlib import Path

import pytest
import yaml

from nanobot.config import Config, config_path, exposed, load, loading
from nanobot.errors import ConfigError
from nanobot.outage import DEFAULT_BACKOFF, Backoff

EXAMPLE = Path(__file__).resolve().parent.parent / "config.example.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_example_loads_and_documents_every_key() -> None:
    config = load(EXAMPLE)
    assert config.agent.model == "openai/gpt-4o-mini"
    assert config.tools.restrict_to_workspace is True
    # Every key of the model appears in the example, so the example is complete.
    documented = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    expected = Config().model_dump(by_alias=True)

    def keys(tree: dict[str, object], prefix: str = "") -> set[str]:
        found = set()
        for key, value in tree.items():
            found.add(prefix + key)
            if isinstance(value, dict):
                found |= keys(value, f"{prefix}{key}.")
        return found

    assert keys(expected) == keys(documented)


def test_example_comments_every_key() -> None:
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    undocumented = [
        line.strip()
        for above, line in itertools.pairwise(lines)
        if ":" in line
        and not line.lstrip().startswith("#")
        and not above.lstrip().startswith("#")
        and not line.rstrip().endswith(":")  # a section header; its keys carry the comments
    ]
    assert undocumented == []


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    config = load()
    assert config.data_dir == tmp_path / ".nanobot"
    assert config.workspace_path == tmp_path / ".nanobot" / "workspace"
    assert config.state_db_path == tmp_path / ".nanobot" / "state.db"


def test_file_location_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config_path() == tmp_path / ".nanobot" / "config.yaml"
    monkeypatch.setenv("NANOBOT_CONFIG", str(tmp_path / "env.yaml"))
    assert config_path() == tmp_path / "env.yaml"
    assert config_path(tmp_path / "cli.yaml") == tmp_path / "cli.yaml"


def test_values_from_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "workspace: ~/ws\ntimezone: Europe/Berlin\n"
        "agent: {model: anthropic/claude, fallbacks: [openai/gpt-4o-mini], max_tokens: 100}\n"
        "channels: {telegram: {enabled: true, token: '1:x', allow_from: [123, '*']}}\n"
        "log: {level: debug, json: true}\n",
    )
    config = load(path)
    assert config.workspace_path == Path("~/ws").expanduser()
    assert config.agent.fallbacks == ["openai/gpt-4o-mini"]
    assert config.channels.telegram.allow_from == ["123", "*"]
    assert config.log.level == "DEBUG"
    assert config.log.json_ is True


def test_env_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "agent: {model: from/file, max_tokens: 100}\n")
    monkeypatch.setenv("NANOBOT_AGENT__MODEL", "from/env")
    monkeypatch.setenv("NANOBOT_AGENT__FALLBACKS", '["a/b", "c/d"]')
    monkeypatch.setenv("NANOBOT_LOG__JSON", "true")
    config = load(path)
    assert config.agent.model == "from/env"
    assert config.agent.max_tokens == 100
    assert config.agent.fallbacks == ["a/b", "c/d"]
    assert config.log.json_ is True


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("agent: {modle: x}\n", "agent.modle", "unknown key"),
        ("nonsense: 1\n", "nonsense", "unknown key"),
        ("agent: {max_tokens: many}\n", "agent.max_tokens", "valid integer"),
        ("agent: {temperature: 7}\n", "agent.temperature", "less than or equal to 2"),
        (
            "agent: {prompt_file_chars: 10}\n",
            "agent.prompt_file_chars",
            "greater than or equal to 1000",
        ),
        ("channels: {telegram: {enabled: maybe}}\n", "channels.telegram.enabled", "boolean"),
        ("log: {level: LOUD}\n", "log.level", "Input should be"),
        ("timezone: Mars/Olympus\n", "timezone", "unknown IANA time zone"),
        ("agent: {transport: grpc}\n", "agent.transport", "Input should be"),
        ("gateway: {event_loop: trio}\n", "gateway.event_loop", "'uvloop' or 'asyncio'"),
        (
            "channels: {discord: {voice_replies: sometimes}}\n",
            "channels.discord.voice_replies",
            "'off', 'when_spoken' or 'always'",
        ),
        (
            "channels: {telegram: {voice_replies: on}}\n",
            "channels.telegram.voice_replies",
            "off, when_spoken, always",
        ),
        ("tts: {max_chars: 50}\n", "tts.max_chars", "greater than or equal to 100"),
        ("tts: {max_chars: 5000}\n", "tts.max_chars", "less than or equal to 4096"),
        ("tts: {voice: '  '}\n", "tts.voice", "must name a voice"),
        (
            "agent: {transport: direct}\n",
            "agent",
            "agent: agent.transport: direct needs agent.api_base (the URL of an "
            "OpenAI-compatible API, e.g. http://localhost:8000/v1)",
        ),
    ],
)
def test_invalid_values_name_file_key_and_reason(
    tmp_path: Path, text: str, key: str, reason: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    assert str(path) in message
    assert f"{key}: " in message
    assert reason in message


def test_event_loop_defaults_to_uvloop(tmp_path: Path) -> None:
    assert load(write(tmp_path, "")).gateway.event_loop == "uvloop"
    assert load(write(tmp_path, "gateway: {event_loop: asyncio}\n")).gateway.event_loop == "asyncio"


def test_transport_defaults_to_auto(tmp_path: Path) -> None:
    assert load(write(tmp_path, "")).agent.transport == "auto"
    direct = "agent: {transport: direct, api_base: 'http://localhost:8000/v1'}\n"
    assert load(write(tmp_path, direct)).agent.transport == "direct"


def test_bad_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "agent:\n  model: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML") as info:
        load(path)
    assert str(path) in str(info.value)
    assert "line" in str(info.value)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mapping"):
        load(write(tmp_path, "- a\n- b\n"))


def test_named_file_must_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load(tmp_path / "missing.yaml")
    monkeypatch.setenv("NANOBOT_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="not found"):
        load()


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match="cannot read"):
        load(path)


def test_bad_env_value_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOBOT_AGENT__MAX_TOKENS", "lots")
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, ""))
    assert "agent.max_tokens" in str(info.value)
    assert "NANOBOT_AGENT__MAX_TOKENS" in str(info.value)


@pytest.mark.parametrize("name", ["NANOBOT_AGENT_MODEL", "NANOBOT_AGENT__MODLE", "NANOBOT_X"])
def test_misspelt_env_variable_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "x")
    with pytest.raises(ConfigError, match=name):
        load(write(tmp_path, ""))


def test_secrets_are_hidden(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "agent: {api_key: sk-verysecret}\nchannels: {discord: {token: discord-secret}}\n",
    )
    config = load(path)
    assert config.agent.api_key is not None
    assert config.agent.api_key.get_secret_value() == "sk-verysecret"
    dumped = repr(config) + str(config.model_dump())
    assert "sk-verysecret" not in dumped
    assert "discord-secret" not in dumped


SECRETS = (
    "agent: {api_key: sk-verysecret}\n"
    "channels: {telegram: {token: '7000000001:AAfile'}, discord: {enabled: false}}\n"
    "store: {url: 'sqlite:///tmp/state.db'}\n"
)


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        (0o644, "can be read by its group and anyone (mode 0644)"),
        (0o640, "can be read by its group (mode 0640)"),
        (0o606, "can be read and changed by anyone (mode 0606)"),
        (0o620, "can be changed by its group (mode 0620)"),
    ],
)
def test_a_config_holding_secrets_that_others_may_read_is_warned_about(
    tmp_path: Path, mode: int, said: str
) -> None:
    path = write(tmp_path, SECRETS)
    path.chmod(mode)
    warning = exposed(load(path))
    assert warning == (
        f"{path} holds secrets (agent.api_key, channels.telegram.token) and {said}: "
        f"run `chmod 600 {path}`"
    )
    assert "sk-verysecret" not in warning and "AAfile" not in warning
    assert stat.S_IMODE(path.stat().st_mode) == mode  # the user's file: left as it is


def test_a_private_config_or_one_without_secrets_is_not_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, SECRETS)
    path.chmod(0o600)
    assert exposed(load(path)) is None
    open_but_harmless = write(
        tmp_path, "agent: {model: openai/gpt-4o}\nstore: {url: 'sqlite:///x.db'}\n"
    )
    open_but_harmless.chmod(0o644)
    monkeypatch.setenv("NANOBOT_AGENT__API_KEY", "sk-from-the-environment")
    assert exposed(load(open_but_harmless)) is None  # the secret is not in the file
    assert exposed(Config()) is None


def test_no_dotenv_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # So there is no second file of secrets whose mode to check: only the YAML and the
    # process environment.
    (tmp_path / ".env").write_text("NANOBOT_AGENT__API_KEY=sk-from-dotenv\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    config = load(write(tmp_path, "agent: {model: openai/gpt-4o}\n"))
    assert config.agent.api_key is None


@pytest.mark.parametrize(
    ("text", "seconds"), [("1h", 3600), ("30m", 1800), ("1h30m", 5400), ("90", 90), ("0", 0)]
)
def test_catch_up_window_takes_a_duration(tmp_path: Path, text: str, seconds: int) -> None:
    config = load(write(tmp_path, f"cron: {{catch_up_window: '{text}'}}\n"))
    assert config.cron.catch_up_window.total_seconds() == seconds


def test_a_bad_duration_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cron\.catch_up_window: .*not a duration"):
        load(write(tmp_path, "cron: {catch_up_window: soon}\n"))


def test_exec_runs_sandboxed_with_the_public_network_by_default(tmp_path: Path) -> None:
    config = load(write(tmp_path, ""))
    assert (config.tools.exec.sandbox, config.tools.exec.network) == ("auto", "public")
    assert config.source == tmp_path / "config.yaml"
    with pytest.raises(ConfigError, match=r"tools.exec.sandbox: Input should be 'auto'"):
        load(write(tmp_path, "tools:\n  exec: {sandbox: docker}\n"))


@pytest.mark.parametrize(
    ("text", "held"),
    [
        ("data_dir: {root}/data\nworkspace: {root}\n", "data_dir"),
        ("data_dir: {root}/data\nworkspace: {root}/data\n", "data_dir"),
        ("data_dir: {root}/data\nworkspace: {root}/.\n", "data_dir"),
        ("data_dir: /elsewhere/data\nworkspace: {root}\n", "the config file"),
    ],
)
def test_a_workspace_holding_nanobots_secrets_is_refused(
    tmp_path: Path, text: str, held: str
) -> None:
    path = write(tmp_path, text.format(root=tmp_path))
    with pytest.raises(ConfigError, match=rf"workspace: .* holds {held}") as caught:
        load(path)
    assert str(caught.value).startswith(f"{path}: invalid configuration")


def test_the_default_workspace_inside_the_data_dir_is_fine(tmp_path: Path) -> None:
    config = load(write(tmp_path, f"data_dir: {tmp_path}\n"))
    assert config.workspace_path == tmp_path / "workspace"


def test_approval_defaults_and_settings(tmp_path: Path) -> None:
    approval = load(write(tmp_path, "")).tools.approval
    assert (approval.exec, approval.cron, approval.spawn, approval.other) == (
        "ask",
        "ask",
        "allow",
        "ask",
    )
    assert (approval.timeout.total_seconds(), approval.unattended) == (600, "ask")
    text = "tools:\n  approval: {exec: Deny, web_fetch: ask, timeout: 1h30m, unattended: deny}\n"
    approval = load(write(tmp_path, text)).tools.approval
    assert (approval.exec, approval.web_fetch, approval.unattended) == ("deny", "ask", "deny")
    assert approval.timeout.total_seconds() == 5400
    assert approval.policies()["exec"] == "deny"
    assert "timeout" not in approval.policies()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("exec: maybe", r"tools\.approval\.exec: Input should be 'allow', 'ask' or 'deny'"),
        ("exec: yes", r"tools\.approval\.exec: Input should be 'allow', 'ask' or 'deny'"),
        ("exce: ask", r"tools\.approval\.exce: unknown key"),
        ("timeout: soon", r"tools\.approval\.timeout: .*not a duration"),
        ("timeout: 0s", r"tools\.approval\.timeout: must be longer than zero"),
        ("unattended: allow", r"tools\.approval\.unattended: Input should be 'ask' or 'deny'"),
    ],
)
def test_bad_approval_settings_name_the_key(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        load(write(tmp_path, f"tools:\n  approval:\n    {text}\n"))


def test_approval_policy_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANOBOT_TOOLS__APPROVAL__EXEC", "deny")
    monkeypatch.setenv("NANOBOT_TOOLS__APPROVAL__TIMEOUT", "2m")
    approval = load(write(tmp_path, "")).tools.approval
    assert (approval.exec, approval.timeout.total_seconds()) == ("deny", 120)


@pytest.mark.parametrize("channel", ["telegram", "discord"])
def test_approvers_are_numeric_user_ids(tmp_path: Path, channel: str) -> None:
    config = load(write(tmp_path, f"channels:\n  {channel}:\n    approvers: [123, '456']\n"))
    assert getattr(config.channels, channel).approvers == ["123", "456"]
    for bad in ("'@owner'", "'*'", "'12a'", "'-5'", "'١٢'"):
        with pytest.raises(ConfigError, match=rf"channels\.{channel}\.approvers: .*not a user id"):
            load(write(tmp_path, f"channels:\n  {channel}:\n    approvers: [{bad}]\n"))


# ---- mistakes get one clear line (issue 16 §2) ---------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        (
            "NANOBOT_AGENT__FALLBACKS",
            "openai/gpt-4o",
            "a JSON list, e.g. NANOBOT_AGENT__FALLBACKS='[\"openai/gpt-4o\"]'",
        ),
        (
            "NANOBOT_CHANNELS__TELEGRAM__ALLOW_FROM",
            "[1,2",
            'a JSON list, e.g. NANOBOT_CHANNELS__TELEGRAM__ALLOW_FROM=\'["1", "2"]\'',
        ),
        (  # a user name is no user id: the example shows only what would be taken
            "NANOBOT_CHANNELS__TELEGRAM__ALLOW_FROM",
            "@alice",
            "a JSON list, e.g. NANOBOT_CHANNELS__TELEGRAM__ALLOW_FROM='[\"123456789\"]'",
        ),
        ("NANOBOT_TOOLS__EXEC__DENY_PATTERNS", "rm -rf", "a JSON list"),  # list | None
        (
            "NANOBOT_CHANNELS__TELEGRAM",
            '{"enabled": true',
            "a JSON object, e.g. NANOBOT_CHANNELS__TELEGRAM='{\"enabled\": ...}', or set one "
            "key at a time: NANOBOT_CHANNELS__TELEGRAM__ENABLED=...",
        ),
        ("NANOBOT_HEARTBEAT__DELIVER_TO", "telegram:42", "a JSON object"),  # section | None
    ],
)
def test_a_list_or_section_variable_that_is_not_json_names_the_variable_and_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, ""))
    message = str(info.value)
    assert message.startswith(f"environment variable {name}: not valid JSON (")
    assert f"it must be {expected}" in message
    assert "\n" not in message


def test_list_variables_in_json_still_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOBOT_CHANNELS__TELEGRAM__ALLOW_FROM", "[1, 2]")
    monkeypatch.setenv("NANOBOT_HEARTBEAT__DELIVER_TO", '{"channel": "telegram", "chat_id": 42}')
    config = load(write(tmp_path, ""))
    assert config.channels.telegram.allow_from == ["1", "2"]
    assert config.heartbeat.deliver_to is not None
    assert config.heartbeat.deliver_to.chat_id == "42"


@pytest.mark.parametrize(
    ("text", "line", "key", "first"),
    [
        ("agent:\n  model: openai/a\nagent:\n  max_tokens: 5\n", 3, "agent", 1),
        ("agent:\n  model: openai/a\n  max_tokens: 5\n  model: openai/b\n", 4, "model", 2),
        ("channels: {telegram: {enabled: true, enabled: false}}\n", 1, "enabled", 1),
    ],
)
def test_a_key_set_twice_is_an_error_naming_file_line_and_key(
    tmp_path: Path, text: str, line: int, key: str, first: int
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value).startswith(
        f"{path}: line {line}: key {key!r} is set twice (first at line {first})"
    )


def test_yaml_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    text = (
        "channels:\n"
        "  telegram: &bot {enabled: false, max_file_mb: 5}\n"
        "  discord:\n    <<: *bot\n    max_file_mb: 8\n"
    )
    assert load(write(tmp_path, text)).channels.discord.max_file_mb == 8


@pytest.mark.parametrize("entry", ["alice", "@alice", "12a", " 42", "-5", "**"])
def test_allow_from_takes_numeric_ids_or_everyone_only(tmp_path: Path, entry: str) -> None:
    path = write(tmp_path, f"channels: {{discord: {{allow_from: [1, {entry!r}]}}}}\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    assert f"channels.discord.allow_from: {entry!r} is not a user id" in message
    assert "usernames" in message and "nanobot pairing list" in message


@pytest.mark.parametrize(
    ("text", "key", "fix"),
    [
        ("agent: {model: gpt-4o}\n", "agent.model", "e.g. openai/gpt-4o"),
        ("agent: {model: claude-sonnet-4-5}\n", "agent.model", "e.g. anthropic/claude-sonnet-4-5"),
        ("agent: {model: llama3}\n", "agent.model", "e.g. openai/llama3"),
        ("agent: {model: openai/}\n", "agent.model", "e.g. openai/gpt-4o"),
        ("agent: {fallbacks: [openai/a, gemini-2.0-flash]}\n", "agent.fallbacks", "gemini/"),
    ],
)
def test_a_model_id_without_its_provider_is_refused_with_the_fix(
    tmp_path: Path, text: str, key: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, text))
    message = str(info.value)
    assert f"{key}: " in message
    assert "write <provider>/<model>" in message and fix in message


def test_the_store_is_the_data_dirs_sqlite_file_by_default(tmp_path: Path) -> None:
    config = load(write(tmp_path, f"data_dir: {tmp_path}\n"))
    assert config.store.url is None
    assert config.store_target == config.state_db_path == tmp_path / "state.db"


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///srv/nanobot/state.db", Path("/srv/nanobot/state.db")),
        ("sqlite:////srv/nanobot/state.db", Path("/srv/nanobot/state.db")),
        ("sqlite:///~/elsewhere.db", Path("~/elsewhere.db").expanduser()),
    ],
)
def test_a_sqlite_store_url_names_its_file(tmp_path: Path, url: str, path: Path) -> None:
    config = load(write(tmp_path, f"store: {{url: '{url}'}}\n"))
    assert config.store_target == config.state_db_path == path


def test_a_postgresql_store_url_is_a_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "postgresql://nanobot:hunter2@db.internal:5432/nanobot"
    monkeypatch.setenv("NANOBOT_STORE__URL", url)
    config = load(write(tmp_path, f"data_dir: {tmp_path}\n"))
    assert config.store_target == url
    assert config.state_db_path == tmp_path / "state.db"  # unused, yet still a place to hide
    assert "hunter2" not in repr(config) + str(config.model_dump())


@pytest.mark.parametrize("url", ["mysql://root:hunter2@db/nano", "hunter2", "sqlite:///"])
def test_a_store_url_of_no_known_backend_names_the_key_not_the_secret(
    tmp_path: Path, url: str
) -> None:
    with pytest.raises(ConfigError, match=r"store\.url: unsupported store URL") as raised:
        load(write(tmp_path, f"store: {{url: '{url}'}}\n"))
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize(("given", "mode"), [("true", "public"), ("false", "none")])
def test_the_old_boolean_network_still_loads_as_a_mode(
    tmp_path: Path, given: str, mode: str
) -> None:
    config = load(write(tmp_path, f"tools:\n  exec: {{network: {given}}}\n"))
    assert config.tools.exec.network == mode
    assert config.tools.exec.legacy_network is (given == "true")
    assert load(write(tmp_path, "")).tools.exec.legacy_network is None


def test_the_old_boolean_from_the_environment_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANOBOT_TOOLS__EXEC__NETWORK", "false")
    assert load(write(tmp_path, "")).tools.exec.network == "none"
    monkeypatch.setenv("NANOBOT_TOOLS__EXEC__NETWORK", "host")
    assert load(write(tmp_path, "")).tools.exec.network == "host"


def test_allow_hosts_are_checked_and_normalised(tmp_path: Path) -> None:
    text = "tools:\n  exec: {allow_hosts: ['127.0.0.1:11434', 'LocalHost.', '[::1]:80', '::1']}\n"
    config = load(write(tmp_path, text))
    assert config.tools.exec.allow_hosts == ["127.0.0.1:11434", "localhost", "[::1]:80", "[::1]"]
    assert [(a.host, a.port) for a in config.tools.exec.allowed_hosts()][:2] == [
        ("127.0.0.1", 11434),
        ("localhost", None),
    ]
    for bad, said in (
        ("'db:0'", "port must be a number from 1 to 65535"),
        ("'http://db:5432'", "not a URL"),
        ("':80'", "expected host"),
    ):
        with pytest.raises(ConfigError, match=rf"tools.exec.allow_hosts: .*{said}"):
            load(write(tmp_path, f"tools:\n  exec: {{allow_hosts: [{bad}]}}\n"))
    with pytest.raises(ConfigError, match=r"tools.exec.network: Input should be 'public'"):
        load(write(tmp_path, "tools:\n  exec: {network: yes-please}\n"))


def test_the_pauses_of_a_failing_store_are_read_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load(write(tmp_path, "")).store.retry == DEFAULT_BACKOFF
    config = load(write(tmp_path, "store: {retry_seconds: [0.5, 10]}\n"))
    assert config.store.retry == Backoff((0.5, 10.0))
    for bad, said in (
        ("[]", "at least one pause"),
        ("[5, 1]", "the pauses may only grow, but 1 follows 5"),
        ("[0]", "a pause must be a positive number of seconds, not 0.0"),
        ("[.inf]", "a pause must be a positive number of seconds, not inf"),
    ):
        with pytest.raises(ConfigError, match=rf"store.retry_seconds: .*{said}"):
            load(write(tmp_path, f"store: {{retry_seconds: {bad}}}\n"))
    monkeypatch.setenv("NANOBOT_STORE__RETRY_SECONDS", "[2, 4]")
    assert load(write(tmp_path, "")).store.retry == Backoff((2.0, 4.0))


def test_an_error_from_the_environment_alone_names_no_missing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANOBOT_AGENT__MAX_TOKENS", "plenty")
    monkeypatch.delenv("NANOBOT_CONFIG", raising=False)
    missing = tmp_path / "nowhere" / "config.yaml"
    monkeypatch.setattr(loading, "DEFAULT_CONFIG_PATH", missing)  # no file at the default
    with pytest.raises(ConfigError) as info:
        load()
    first, *rest = str(info.value).splitlines()
    assert first == f"the environment (no config file at {missing}): invalid configuration"
    assert "from environment variable NANOBOT_AGENT__MAX_TOKENS" in rest[0]


def test_spoken_replies_read_as_written(tmp_path: Path) -> None:
    # YAML reads a bare `off` as false: it still means off.
    config = load(
        write(
            tmp_path,
            "channels: {telegram: {voice_replies: off}, discord: {voice_replies: When_Spoken}}\n"
            "tts: {model: openai/tts-1}\n",
        )
    )
    assert config.channels.telegram.voice_replies == "off"
    assert config.channels.discord.voice_replies == "when_spoken"
    assert (config.tts.model, config.tts.voice, config.tts.max_chars) == (
        "openai/tts-1",
        "alloy",
        1500,
    )
