"""Tests for the fake OpenAI-compatible server in ``tests.fakes.llm``."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import audio
from tests.fakes.llm import (
    SPEECH_RATE,
    AuthError,
    Call,
    ContextLengthError,
    Cut,
    Disconnect,
    Echo,
    ErrorBody,
    FakeLLM,
    Hang,
    RateLimit,
    Reply,
    ServerError,
    StreamError,
    Text,
    ToolCalls,
    ToolThenText,
    TranscriptionRequest,
    reply_from_json,
    speech_audio,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
JSON = dict[str, Any]


def _request(model: str = "fake-model", stream: bool = False, text: str = "hi") -> JSON:
    body: JSON = {"model": model, "messages": [{"role": "user", "content": text}]}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


async def _stream(base_url: str, body: JSON) -> list[JSON]:
    """POST a streaming request; return the decoded chunks (asserting the ``[DONE]`` end)."""
    events: list[str] = []
    async with (
        httpx.AsyncClient(trust_env=False) as client,
        client.stream("POST", f"{base_url}/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line:
                assert line.startswith("data: ")
                events.append(line.removeprefix("data: "))
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def _post(base_url: str, body: JSON, path: str = "/chat/completions") -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False) as client:
        return await client.post(f"{base_url}{path}", json=body)


def _reassemble(chunks: list[JSON]) -> tuple[str, dict[int, JSON]]:
    """Fold stream deltas into (content, {index: {"id", "name", "arguments"}})."""
    content, calls = "", dict[int, JSON]()
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                call = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.get("id") or call["id"]
                function = tc.get("function") or {}
                call["name"] += function.get("name") or ""
                call["arguments"] += function.get("arguments") or ""
    return content, calls


async def test_streams_text_in_word_chunks_with_usage_last() -> None:
    async with FakeLLM(Text("the quick brown fox jumps")) as fake:
        chunks = await _stream(fake.base_url, _request(stream=True))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["model"] == "fake-model" and isinstance(c["created"], int) for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content_chunks) == 5
    content, calls = _reassemble(chunks)
    assert (content, calls) == ("the quick brown fox jumps", {})
    assert chunks[-2]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])


async def test_no_usage_chunk_unless_requested() -> None:
    async with FakeLLM(Text("hello")) as fake:
        chunks = await _stream(fake.base_url, {**_request(), "stream": True})
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_streamed_tool_calls_reassemble_into_valid_json() -> None:
    calls = [
        Call("read_file", {"path": "notes/todo.md", "limit": 200}, id="call_read"),
        Call("shell", '{"command": "ls -la"}'),
    ]
    async with FakeLLM(ToolCalls(calls, content="Let me look.")) as fake:
        chunks = await _stream(fake.base_url, _request(stream=True))
    content, assembled = _reassemble(chunks)
    assert content == "Let me look."
    assert assembled[0] == {
        "id": "call_read",
        "name": "read_file",
        "arguments": json.dumps({"path": "notes/todo.md", "limit": 200}),
    }
    assert json.loads(assembled[1]["arguments"]) == {"command": "ls -la"}
    assert assembled[1]["id"].startswith("call_")
    first_deltas = [
        tc
        for c in chunks
        if c["choices"]
        for tc in c["choices"][0]["delta"].get("tool_calls", [])
        if "id" in tc
    ]
    assert [tc["function"] for tc in first_deltas] == [
        {"name": "read_file", "arguments": ""},
        {"name": "shell", "arguments": ""},
    ]
    assert all(tc["type"] == "function" for tc in first_deltas)
    fragments = [
        tc
        for c in chunks
        if c["choices"]
        for tc in c["choices"][0]["delta"].get("tool_calls", [])
        if tc["index"] == 0 and "id" not in tc
    ]
    assert len(fragments) >= 3
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


async def test_tool_calls_without_content_carry_the_role_on_the_first_call() -> None:
    async with FakeLLM(ToolCalls([Call("noop")])) as fake:
        chunks = await _stream(fake.base_url, _request(stream=True))
    first = chunks[0]["choices"][0]["delta"]
    assert first["role"] == "assistant" and first["content"] is None
    assert first["tool_calls"][0]["function"] == {"name": "noop", "arguments": ""}
    assert _reassemble(chunks)[1][0]["arguments"] == "{}"


async def test_non_streaming_reply_is_a_chat_completion_with_usage() -> None:
    async with FakeLLM(ToolCalls([Call("read_file", {"path": "a"}, id="call_1")])) as fake:
        response = await _post(fake.base_url, _request())
    data = response.json()
    assert data["object"] == "chat.completion"
    assert data["id"].startswith("chatcmpl-")
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "a"}'},
        }
    ]
    assert data["usage"]["total_tokens"] > 0


async def test_default_reply_echoes_the_last_user_message() -> None:
    async with FakeLLM() as fake:
        body = _request(text="first")
        body["messages"] += [
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": [{"type": "text", "text": "second"}]},
        ]
        data = (await _post(fake.base_url, body, path="/chat/completions")).json()
        chunks = await _stream(fake.base_url.removesuffix("/v1"), _request(stream=True, text="s"))
    assert data["choices"][0]["message"]["content"] == "echo: second"
    assert _reassemble(chunks)[0] == "echo: s"
    assert [r.path for r in fake.requests] == ["/v1/chat/completions", "/chat/completions"]


async def test_tool_then_text_answers_a_tool_result_with_text() -> None:
    reply = reply_from_json(
        {
            "type": "ToolThenText",
            "call": {"name": "list_dir", "arguments": {"path": "."}},
            "text": "All done.",
        }
    )
    assert reply == ToolThenText(Call("list_dir", {"path": "."}), "All done.")
    async with FakeLLM(default_reply=reply) as fake:
        first = await _stream(fake.base_url, _request(stream=True))
        (call,) = _reassemble(first)[1].values()
        body = _request(stream=True)
        body["messages"] += [
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["name"], "arguments": call["arguments"]},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call["id"], "content": "a.txt"},
        ]
        second = await _stream(fake.base_url, body)
        again = await _stream(fake.base_url, _request(stream=True, text="next"))
    assert (call["name"], json.loads(call["arguments"])) == ("list_dir", {"path": "."})
    assert _reassemble(second) == ("All done.", {})
    assert _reassemble(again)[1][0]["name"] == "list_dir"


async def test_rate_limit_has_retry_after_and_openai_body() -> None:
    async with FakeLLM(RateLimit(2.5)) as fake:
        response = await _post(fake.base_url, _request(stream=True))
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "3"
    assert response.headers["retry-after-ms"] == "2500"
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "rate_limit_exceeded"
    assert error["message"]


async def test_an_error_body_is_sent_as_given() -> None:
    body = {"error": {"code": 400, "message": "too big", "type": "exceed_context_size_error"}}
    async with FakeLLM(ErrorBody(400, body), ErrorBody(500, "plain words")) as fake:
        shaped = await _post(fake.base_url, _request())
        plain = await _post(fake.base_url, _request())
    assert (shaped.status_code, shaped.json()) == (400, body)
    assert (plain.status_code, plain.text) == (500, "plain words")


async def test_a_stream_error_comes_after_the_content_or_as_an_http_error() -> None:
    error = {"message": "context window exceeded", "code": 400}
    async with FakeLLM(StreamError(error, content="Hello there"), StreamError(error)) as fake:
        events: list[str] = []
        async with (
            httpx.AsyncClient(trust_env=False) as client,
            client.stream(
                "POST", f"{fake.base_url}/chat/completions", json=_request(stream=True)
            ) as response,
        ):
            assert response.status_code == 200
            events = [line async for line in response.aiter_lines() if line]
        whole = await _post(fake.base_url, _request())
    chunks = [json.loads(e.removeprefix("data: ")) for e in events]
    assert _reassemble(chunks[:-1])[0] == "Hello there"
    assert chunks[-1] == {"error": error}  # and no [DONE]
    assert (whole.status_code, whole.json()) == (400, {"error": error})


async def test_a_reported_cost_is_in_the_usage() -> None:
    async with FakeLLM(Text("hi", cost=0.25), Text("hi", cost=0.5), Text("hi")) as fake:
        whole = (await _post(fake.base_url, _request())).json()["usage"]
        streamed = (await _stream(fake.base_url, _request(stream=True)))[-1]["usage"]
        unpriced = (await _post(fake.base_url, _request())).json()["usage"]
    assert (whole["cost"], streamed["cost"]) == (0.25, 0.5)
    assert "cost" not in unpriced


@pytest.mark.parametrize(
    ("reply", "status", "type_", "code"),
    [
        (ContextLengthError(), 400, "invalid_request_error", "context_length_exceeded"),
        (AuthError(), 401, "invalid_request_error", "invalid_api_key"),
        (ServerError(), 500, "server_error", None),
        (ServerError(status=503), 503, "server_error", None),
    ],
)
async def test_error_replies(reply: Reply, status: int, type_: str, code: str | None) -> None:
    async with FakeLLM(reply) as fake:
        response = await _post(fake.base_url, _request())
    assert response.status_code == status
    error = response.json()["error"]
    assert (error["type"], error["code"]) == (type_, code)
    if code == "context_length_exceeded":
        assert error["message"] == (
            "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9000 tokens. Please reduce the length of the messages."
        )


async def test_hang_is_cancellable_and_stop_returns_promptly() -> None:
    fake = FakeLLM(Hang(), Hang())
    await fake.start()
    cancelled = asyncio.create_task(_post(fake.base_url, _request()))
    pending = asyncio.create_task(_post(fake.base_url, _request()))
    await fake.wait_for_requests(2)
    await asyncio.sleep(0.1)  # a "nothing comes back" check: a reply would arrive well within
    assert not cancelled.done() and not pending.done()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    started = time.monotonic()
    await fake.stop()
    assert time.monotonic() - started < 2
    with pytest.raises(httpx.HTTPError):
        await pending
    await fake.stop()  # idempotent


async def test_disconnect_breaks_the_stream_mid_way() -> None:
    async with FakeLLM(Disconnect(), Disconnect(), Text("after")) as fake:
        received: list[str] = []
        with pytest.raises(httpx.HTTPError):
            async with (
                httpx.AsyncClient(trust_env=False) as client,
                client.stream(
                    "POST", f"{fake.base_url}/chat/completions", json=_request(stream=True)
                ) as response,
            ):
                async for line in response.aiter_lines():
                    received.append(line)
        with pytest.raises(httpx.HTTPError):
            await _post(fake.base_url, _request())
        assert (await _post(fake.base_url, _request())).status_code == 200
    assert received and "partial" in received[0]
    assert "[DONE]" not in "".join(received)


async def test_cut_ends_the_stream_cleanly_without_a_finish_reason_or_done() -> None:
    async with FakeLLM(Cut("one two three four", chunks=2), Cut("one two")) as fake:
        async with (
            httpx.AsyncClient(trust_env=False) as client,
            client.stream(
                "POST", f"{fake.base_url}/chat/completions", json=_request(stream=True)
            ) as response,
        ):
            events = [line async for line in response.aiter_lines() if line]
        whole = await _post(fake.base_url, _request())
    chunks = [json.loads(line.removeprefix("data: ")) for line in events]
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": "one "},
    ]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert whole.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(whole.content)  # half a body, ended cleanly


async def test_delays_apply_before_the_first_byte() -> None:
    replies = (Text("slow", delay=0.3), Text("fast", delay=0))
    async with FakeLLM(*replies, delay=0.6) as fake:
        elapsed = []
        for _ in range(3):
            started = time.monotonic()
            await _post(fake.base_url, _request())
            elapsed.append(time.monotonic() - started)
    slow, fast, default = elapsed
    assert slow >= 0.3 and fast < 0.6 <= default


async def test_records_requests() -> None:
    async with FakeLLM(Text("a"), Text("b")) as fake:
        before = time.monotonic()
        tools = [{"type": "function", "function": {"name": "t", "parameters": {}}}]
        async with httpx.AsyncClient(trust_env=False) as client:
            await client.post(
                f"{fake.base_url}/chat/completions",
                json={**_request(model="m1"), "tools": tools},
                headers={"Authorization": "Bearer sk-test"},
            )
        await _post(fake.base_url, _request(model="m2", stream=True))
        after = time.monotonic()
        async with httpx.AsyncClient(trust_env=False) as client:
            models = (await client.get(f"{fake.base_url}/models")).json()
    assert fake.request_count == 2
    first, second = fake.requests
    assert (first.model, second.model) == ("m1", "m2")
    assert first.messages == [{"role": "user", "content": "hi"}]
    assert first.tools == tools and second.tools == []
    assert first.headers["Authorization"] == "Bearer sk-test"
    assert second.body["stream"] is True
    assert before <= first.received_at <= second.received_at <= after
    assert {"m1", "m2", "fake-model"} <= {m["id"] for m in models["data"]}
    assert fake.pending == 0


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[1, 2]", b'{"model": "m", "messages": "hi"}'],
    ids=["not JSON", "not an object", "messages not an array"],
)
async def test_a_malformed_body_is_a_400_and_not_recorded(body: bytes) -> None:
    async with FakeLLM() as fake, httpx.AsyncClient(trust_env=False) as client:
        response = await client.post(
            f"{fake.base_url}/chat/completions",
            content=body,
            headers={"Content-Type": "application/json"},
        )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert fake.request_count == 0


async def test_echoes_the_last_user_message_past_others() -> None:
    messages: list[JSON] = [
        {"role": "user", "content": "first"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "sec"}, {"type": "text", "text": "ond"}],
        },
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "c1", "content": "result"},
    ]
    async with FakeLLM() as fake:
        reply = (await _post(fake.base_url, {"model": "m", "messages": messages})).json()
    assert reply["choices"][0]["message"]["content"] == "echo: second"
    assert fake.requests[0].messages == messages  # the record parses the whole body


async def test_keeps_only_the_newest_requests_when_told() -> None:
    async with FakeLLM(keep_requests=2) as fake:
        for text in ("one", "two", "three"):
            await _post(fake.base_url, _request(text=text))
        await fake.wait_for_requests(3)
    assert fake.request_count == 3
    assert [r.messages[0]["content"] for r in fake.requests] == ["two", "three"]
    with pytest.raises(ValueError, match="keep_requests must be at least 1"):
        FakeLLM(keep_requests=0)


async def test_per_model_scripts_take_precedence() -> None:
    async with FakeLLM() as fake:
        fake.script_for("openai/model-a", ServerError(), RateLimit(1))
        fake.script_for("model-b", Text("from b"))
        fake.script(Text("shared"))
        statuses = [(await _post(fake.base_url, _request("model-a"))).status_code for _ in "ab"]
        b = (await _post(fake.base_url, _request("model-b"))).json()
        a = (await _post(fake.base_url, _request("model-a"))).json()
        rest = (await _post(fake.base_url, _request("model-b", text="x"))).json()
    assert statuses == [500, 429]
    assert b["choices"][0]["message"]["content"] == "from b"
    assert a["choices"][0]["message"]["content"] == "shared"
    assert rest["choices"][0]["message"]["content"] == "echo: x"


async def test_a_subprocess_reaches_the_in_process_fake() -> None:
    code = (
        "import json, sys, urllib.request\n"
        "body = json.dumps({'model': 'fake-model', 'messages': [{'role': 'user', "
        "'content': 'ping'}]}).encode()\n"
        "req = urllib.request.Request(sys.argv[1] + '/chat/completions', body, "
        "{'Content-Type': 'application/json'})\n"
        "print(json.load(urllib.request.urlopen(req))['choices'][0]['message']['content'])\n"
    )
    async with FakeLLM() as fake:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, fake.base_url, stdout=asyncio.subprocess.PIPE
        )
        stdout, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0
    assert stdout.decode().strip() == "echo: ping"
    assert fake.request_count == 1


async def test_standalone_process_serves_a_script_until_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "replies": [{"type": "ToolCalls", "calls": [{"name": "f", "arguments": {"a": 1}}]}],
                "models": {"broken": [{"type": "ServerError", "status": 502}]},
            }
        )
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.llm",
        "--script",
        str(script),
        "--keep-requests",
        "2",
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        base_url = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        assert (await _post(base_url, _request("broken"))).status_code == 502
        chunks = await _stream(base_url, _request(stream=True))
        assert json.loads(_reassemble(chunks)[1][0]["arguments"]) == {"a": 1}
        root = base_url.removesuffix("/v1")
        async with httpx.AsyncClient(trust_env=False) as client:
            scripted = await client.post(
                f"{root}/_fake/script", json={"replies": [{"type": "Text", "content": "late"}]}
            )
            assert scripted.json() == {"pending": 1}
            data = (await client.post(f"{base_url}/chat/completions", json=_request())).json()
            assert data["choices"][0]["message"]["content"] == "late"
            recorded = (await client.get(f"{root}/_fake/requests")).json()
        assert [r["body"]["model"] for r in recorded] == ["fake-model", "fake-model"]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 30) == 0


async def test_litellm_round_trips_a_streamed_tool_call() -> None:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm  # noqa: TID251 - the fake must satisfy the real client

    # litellm 1.106 imports the optional ``mcp`` package whenever ``tools=`` is passed
    # (main.completion -> litellm.responses.mcp); without it the call fails with
    # "APIConnectionError: OpenAIException - No module named 'mcp'". The private
    # ``_skip_mcp_handler`` flag bypasses that import; it is only used when mcp is absent.
    no_mcp: dict[str, Any] = {} if find_spec("mcp") else {"_skip_mcp_handler": True}

    arguments = {"path": "docs/README.md"}
    async with FakeLLM(ToolCalls([Call("read_file", arguments, id="call_abc")])) as fake:
        response = await litellm.acompletion(
            model="openai/fake-model",
            api_base=fake.base_url,
            api_key="sk-test",
            messages=[{"role": "user", "content": "read the readme"}],
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "read_file",
                        "parameters": {
                            "type": "object",
                            "properties": {"path": {"type": "string"}},
                            "required": ["path"],
                        },
                    },
                }
            ],
            stream=True,
            stream_options={"include_usage": True},
            **no_mcp,
        )
        name, args, call_id, finish, usage = "", "", None, None, None
        async for chunk in response:
            choice = chunk.choices[0] if chunk.choices else None
            if choice is not None:
                finish = choice.finish_reason or finish
                for tc in choice.delta.tool_calls or []:
                    call_id = tc.id or call_id
                    name += tc.function.name or ""
                    args += tc.function.arguments or ""
            usage = getattr(chunk, "usage", None) or usage
    assert (name, call_id, finish) == ("read_file", "call_abc", "tool_calls")
    assert json.loads(args) == arguments
    assert usage is not None and usage.total_tokens > 0
    request = fake.requests[0]
    assert request.model == "fake-model"
    assert request.body["stream"] is True
    assert request.tools[0]["function"]["name"] == "read_file"


# ---- audio ------------------------------------------------------------------------------


def _litellm() -> Any:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm  # noqa: TID251 - the fake must satisfy the real client

    return litellm


async def _transcribe(
    base_url: str,
    data: bytes | None,
    filename: str = "note.ogg",
    content_type: str = "audio/ogg",
    **fields: str,
) -> httpx.Response:
    """POST a multipart upload as the OpenAI SDK sends it (``data=None``: no file part)."""
    parts: list[tuple[str, tuple[str | None, bytes | str, str | None]]] = [
        (name, (None, value, None)) for name, value in fields.items()
    ]
    if data is not None:
        parts.append(("file", (filename, data, content_type)))
    async with httpx.AsyncClient(trust_env=False) as client:
        if not parts:  # httpx sends an empty form urlencoded: force multipart
            return await client.post(
                f"{base_url}/audio/transcriptions",
                content=b"--x--\r\n",
                headers={"Content-Type": "multipart/form-data; boundary=x"},
            )
        return await client.post(f"{base_url}/audio/transcriptions", files=parts)


@pytest.mark.parametrize(
    ("model", "sent_as", "response_format"),
    [  # litellm asks whisper-1 for verbose_json (for the duration its price needs)
        ("openai/whisper-1", "whisper-1", "verbose_json"),
        ("openai/gpt-4o-mini-transcribe", "gpt-4o-mini-transcribe", "json"),
        ("groq/whisper-large-v3", "whisper-large-v3", "json"),
        ("hosted_vllm/Systran/faster-whisper-small", "Systran/faster-whisper-small", "json"),
    ],
)
async def test_litellm_transcribes_an_upload_by_its_digest(
    model: str, sent_as: str, response_format: str
) -> None:
    litellm = _litellm()
    note = audio.ogg_opus(2.4)
    async with FakeLLM() as fake:
        key = fake.add_transcript(note, "hello there")
        response = await litellm.atranscription(
            model=model,
            file=("voice.oga", note, "audio/ogg"),
            api_base=fake.base_url,
            api_key="sk-audio",
            language="en",
            prompt="names: Ada",
            max_retries=0,
        )
    assert response.text == "hello there"
    assert key == audio.digest(note)
    [asked] = fake.audio_requests
    assert isinstance(asked, TranscriptionRequest)
    assert (asked.path, asked.model) == ("/v1/audio/transcriptions", sent_as)
    assert (asked.filename, asked.content_type, asked.size) == ("voice.oga", "audio/ogg", len(note))
    assert (asked.sha256, asked.data) == (key, note)
    assert (asked.language, asked.prompt) == ("en", "names: Ada")
    assert asked.response_format == response_format
    assert asked.headers["Authorization"] == "Bearer sk-audio"
    assert fake.requests == [] and fake.request_count == 0  # the chat record is apart


async def test_litellm_reads_the_duration_of_a_verbose_transcription() -> None:
    litellm = _litellm()
    tone = audio.wav(1.25)
    async with FakeLLM() as fake:
        fake.add_transcript(tone, "a short tone")
        verbose = await litellm.atranscription(
            model="openai/whisper-1",
            file=("tone.wav", tone, "audio/wav"),
            api_base=fake.base_url,
            api_key="k",
            response_format="verbose_json",
            language="de",
            max_retries=0,
        )
        text = await litellm.atranscription(
            model="openai/whisper-1",
            file=("tone.wav", tone, "audio/wav"),
            api_base=fake.base_url,
            api_key="k",
            response_format="text",
            max_retries=0,
        )
    assert (verbose.text, verbose.duration, verbose.language) == ("a short tone", 1.25, "german")
    assert text.text.strip() == "a short tone"
    assert [r.response_format for r in fake.transcription_requests] == ["verbose_json", "text"]


async def test_each_response_format_has_openai_shape() -> None:
    note = audio.ogg_opus(3.5)
    async with FakeLLM() as fake:
        fake.add_transcript(note, "one two three four")
        answers = {
            fmt: await _transcribe(fake.base_url, note, model="whisper-1", response_format=fmt)
            for fmt in ("json", "text", "srt", "vtt")
        }
        async with httpx.AsyncClient(trust_env=False) as client:
            words = await client.post(
                f"{fake.base_url}/audio/transcriptions",
                data={
                    "model": "whisper-1",
                    "response_format": "verbose_json",
                    "timestamp_granularities[]": ["word", "segment"],
                },
                files={"file": ("note.ogg", note, "audio/ogg")},
            )
    assert answers["json"].json() == {
        "text": "one two three four",
        "usage": {"type": "duration", "seconds": 4},
    }
    assert answers["text"].headers["content-type"].startswith("text/plain")
    assert answers["text"].text == "one two three four\n"
    assert answers["srt"].text == "1\n00:00:00,000 --> 00:00:03,500\none two three four\n\n"
    assert answers["vtt"].text.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:03.500\none two")
    verbose = words.json()
    assert verbose["duration"] == 3.5 and verbose["task"] == "transcribe"
    assert [w["word"] for w in verbose["words"]] == ["one", "two", "three", "four"]
    assert verbose["words"][-1]["end"] == 3.5
    assert verbose["segments"][0]["end"] == 3.5
    assert fake.transcription_requests[-1].fields.count(("timestamp_granularities[]", "word")) == 1


async def test_an_unknown_audio_is_refused_unless_a_default_is_set() -> None:
    known, other = audio.wav(0.2), audio.wav(0.3)
    async with FakeLLM() as fake:
        fake.add_transcript(known, "known")
        refused = await _transcribe(fake.base_url, other, "a.wav", "audio/wav", model="m")
        fake.default_transcript = "anything"
        default = await _transcribe(fake.base_url, other, "a.wav", "audio/wav", model="m")
        still_known = await _transcribe(fake.base_url, known, "a.wav", "audio/wav", model="m")
    assert refused.status_code == 400
    assert refused.json()["error"] == {
        "message": "Audio file might be corrupted or unsupported",
        "type": "invalid_request_error",
        "param": "file",
        "code": "invalid_value",
    }
    assert default.json()["text"] == "anything"
    assert still_known.json()["text"] == "known"
    assert len(fake.audio_requests) == 3  # a valid request is kept though it was refused


async def test_a_request_openai_refuses_is_answered_with_its_error_and_not_kept() -> None:
    note = audio.ogg_opus(1.0)
    async with FakeLLM() as fake:
        fake.max_audio_bytes = len(note) - 1
        no_file = await _transcribe(fake.base_url, None, model="whisper-1")
        no_model = await _transcribe(fake.base_url, note)
        neither = await _transcribe(fake.base_url, None)
        too_big = await _transcribe(fake.base_url, note, model="whisper-1")
        fake.max_audio_bytes = 10**6
        as_json = await _post(fake.base_url, {"model": "whisper-1"}, "/audio/transcriptions")
        not_audio = await _transcribe(fake.base_url, note, "note.txt", "text/plain", model="m")
        language = await _transcribe(fake.base_url, note, model="m", language="English")
        response_format = await _transcribe(fake.base_url, note, model="m", response_format="xml")
        async with httpx.AsyncClient(trust_env=False) as client:
            file_as_text = await client.post(
                f"{fake.base_url}/audio/transcriptions",
                files={"model": (None, "m"), "file": (None, "not a file")},
            )
        fake.audio_formats = None  # a local whisper server takes any name
        fake.default_transcript = "ok"
        any_name = await _transcribe(fake.base_url, note, "note.txt", "text/plain", model="m")
    missing = "field required (type=value_error.missing)"
    assert no_file.status_code == no_model.status_code == neither.status_code == 400
    assert no_file.json()["error"]["message"] == (
        f"1 validation error for Request\nbody -> file\n  {missing}"
    )
    assert no_model.json()["error"]["message"].endswith(f"body -> model\n  {missing}")
    assert neither.json()["error"]["message"].startswith("2 validation errors for Request")
    assert too_big.status_code == 413
    assert too_big.json()["error"]["message"].startswith(
        f"Maximum content size limit ({len(note) - 1}) exceeded ("
    )
    assert as_json.status_code == 400
    assert "expected multipart/form-data" in as_json.json()["error"]["message"]
    assert not_audio.status_code == 400
    assert not_audio.json()["error"]["message"].startswith(
        "Invalid file format. Supported formats: ['flac', 'm4a', 'mp3', 'mp4', 'mpeg', 'mpga', "
        "'oga', 'ogg', 'wav', 'webm']"
    )
    assert (language.status_code, language.json()["error"]["param"]) == (400, "language")
    assert response_format.json()["error"]["param"] == "response_format"
    assert "Expected UploadFile" in file_as_text.json()["error"]["message"]
    assert any_name.json()["text"] == "ok"
    assert [r.filename for r in fake.transcription_requests] == ["note.txt"]
    assert all(
        r.json()["error"]["type"] in ("invalid_request_error", "server_error")
        for r in (no_file, too_big, as_json, not_audio, language, response_format)
    )


async def test_audio_faults_come_from_the_models_queue_not_the_chat_queue() -> None:
    litellm = _litellm()
    tone = audio.wav(0.5)
    async with FakeLLM() as fake:
        fake.add_transcript(tone, "from the table")
        fake.script(Text("for the chat"))
        fake.script_for("openai/whisper-1", RateLimit(2.5), ServerError(503), Text("scripted"))
        statuses = []
        for _ in range(2):
            answer = await _transcribe(fake.base_url, tone, "t.wav", model="whisper-1")
            statuses.append((answer.status_code, answer.headers.get("retry-after")))
        scripted = await _transcribe(fake.base_url, tone, "t.wav", model="whisper-1")
        tabled = await _transcribe(fake.base_url, tone, "t.wav", model="whisper-1")
        fake.script_for("whisper-1", RateLimit(1))
        with pytest.raises(litellm.RateLimitError):
            await litellm.atranscription(
                model="openai/whisper-1",
                file=("t.wav", tone, "audio/wav"),
                api_base=fake.base_url,
                api_key="k",
                max_retries=0,
            )
        chat = (await _post(fake.base_url, _request())).json()
    assert statuses == [(429, "3"), (503, None)]
    assert scripted.json()["text"] == "scripted"
    assert tabled.json()["text"] == "from the table"
    assert chat["choices"][0]["message"]["content"] == "for the chat"
    assert fake.pending == 0


async def test_a_hanging_transcription_is_released_by_stop() -> None:
    note = audio.ogg_opus(0.5)
    fake = FakeLLM()
    await fake.start()
    fake.add_transcript(note, "never")
    fake.script_for("whisper-1", Hang())
    pending = asyncio.create_task(_transcribe(fake.base_url, note, model="whisper-1"))
    await fake.wait_for_audio_requests(1)
    await asyncio.wait_for(fake.stop(), 5)
    with pytest.raises(httpx.RemoteProtocolError):
        await asyncio.wait_for(pending, 5)


async def test_delayed_and_broken_audio_answers() -> None:
    note = audio.ogg_opus(0.5)
    async with FakeLLM() as fake:
        fake.add_transcript(note, "late but whole")
        fake.script_for("whisper-1", Echo(delay=0.3), Disconnect(), Cut())
        started = time.monotonic()
        late = await _transcribe(fake.base_url, note, model="whisper-1")
        waited = time.monotonic() - started
        with pytest.raises(httpx.RemoteProtocolError):
            await _transcribe(fake.base_url, note, model="whisper-1")
        cut = await _transcribe(fake.base_url, note, model="whisper-1")
    assert late.json()["text"] == "late but whole" and waited >= 0.3
    assert cut.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.content)


@pytest.mark.parametrize(
    ("response_format", "content_type"),
    [
        ("opus", "audio/opus"),
        ("mp3", "audio/mpeg"),
        ("wav", "audio/wav"),
        ("pcm", "audio/pcm"),
        ("flac", "audio/flac"),
        ("aac", "audio/aac"),
    ],
)
async def test_litellm_speech_answers_audio_of_the_format_asked(
    response_format: str, content_type: str
) -> None:
    litellm = _litellm()
    text = "Here is the weather for today."
    async with FakeLLM() as fake:
        spoken = await litellm.aspeech(
            model="openai/tts-1",
            input=text,
            voice="alloy",
            response_format=response_format,
            api_base=fake.base_url,
            api_key="sk-tts",
            max_retries=0,
        )
    assert spoken.response.headers["content-type"] == content_type
    assert spoken.content == speech_audio(text, response_format)
    [asked] = fake.speech_requests
    assert (asked.path, asked.model, asked.input, asked.voice) == (
        "/v1/audio/speech",
        "tts-1",
        text,
        "alloy",
    )
    assert asked.response_format == response_format
    assert asked.headers["Authorization"] == "Bearer sk-tts"
    seconds = len(text) / SPEECH_RATE
    magic = {
        "opus": b"OggS",
        "wav": b"RIFF",
        "flac": b"fLaC",
        "mp3": b"\xff\xfb",
        "aac": b"\xff\xf1",
    }
    assert spoken.content.startswith(magic.get(response_format, b""))
    if response_format in ("opus", "wav"):
        assert audio.duration(spoken.content) == pytest.approx(seconds, abs=0.02)
    if response_format == "pcm":  # 24 kHz, 16-bit, mono, no header
        assert len(spoken.content) == 2 * round(seconds * 24_000)


def test_speech_depends_on_the_text_and_the_speed() -> None:
    normal = audio.duration(speech_audio("same length!", "opus"))
    slow = audio.duration(speech_audio("same length!", "opus", speed=0.5))
    assert normal is not None and slow == pytest.approx(2 * normal, abs=0.02)
    assert speech_audio("same length!", "opus") != speech_audio("other words!", "opus")
    assert speech_audio("same length!", "wav") != speech_audio("other words!", "wav")
    assert audio.duration(speech_audio("", "wav")) == 0.2  # never empty


async def test_speech_requests_openai_refuses() -> None:
    base: JSON = {"model": "tts-1", "input": "hi", "voice": "alloy"}
    async with FakeLLM() as fake:
        answers = {
            "no voice": await _post(
                fake.base_url, {"model": "tts-1", "input": "hi"}, "/audio/speech"
            ),
            "voice": await _post(fake.base_url, {**base, "voice": "bob"}, "/audio/speech"),
            "format": await _post(
                fake.base_url, {**base, "response_format": "ogg"}, "/audio/speech"
            ),
            "speed": await _post(fake.base_url, {**base, "speed": 5}, "/audio/speech"),
            "input": await _post(fake.base_url, {**base, "input": "x" * 4097}, "/audio/speech"),
        }
        fake.voices = None
        local_voice = await _post(fake.base_url, {**base, "voice": "af_bella"}, "/audio/speech")
    errors = {name: answer.json()["error"] for name, answer in answers.items()}
    assert all(answer.status_code == 400 for answer in answers.values())
    assert errors["no voice"]["message"] == "Missing required parameter: 'voice'."
    assert {name: e["param"] for name, e in errors.items()} == {
        "no voice": "voice",
        "voice": "voice",
        "format": "response_format",
        "speed": "speed",
        "input": "input",
    }
    assert errors["format"]["message"] == (
        "Invalid value: 'ogg'. Supported values are: 'mp3', 'opus', 'aac', 'flac', 'wav', "
        "and 'pcm'."
    )
    assert errors["input"]["code"] == "string_above_max_length"
    assert local_voice.status_code == 200
    assert local_voice.headers["content-type"] == "audio/mpeg"
    assert [r.voice for r in fake.speech_requests] == ["af_bella"]


async def test_speech_faults_and_litellm_errors() -> None:
    litellm = _litellm()
    async with FakeLLM() as fake:
        fake.script_for("tts-1", ServerError(500), AuthError())
        with pytest.raises(litellm.InternalServerError):
            await litellm.aspeech(
                model="openai/tts-1",
                input="hi",
                voice="alloy",
                api_base=fake.base_url,
                api_key="k",
                max_retries=0,
            )
        with pytest.raises(litellm.AuthenticationError):
            await litellm.aspeech(
                model="openai/tts-1",
                input="hi",
                voice="alloy",
                api_base=fake.base_url,
                api_key="bad",
                max_retries=0,
            )
    assert [r.input for r in fake.speech_requests] == ["hi", "hi"]


async def test_audio_control_api_and_script_file() -> None:
    note, other = audio.ogg_opus(0.4), audio.ogg_opus(0.6)
    async with FakeLLM() as fake:
        fake.load_script(
            {"transcripts": {audio.digest(note): "from the script"}, "default_transcript": "?"}
        )
        root = fake.base_url.removesuffix("/v1")
        async with httpx.AsyncClient(trust_env=False) as client:
            added = await client.post(
                f"{root}/_fake/transcripts",
                json={"content_base64": base64.b64encode(other).decode(), "text": "posted"},
            )
            await client.post(
                f"{root}/_fake/transcripts", json={"sha256": "ab" * 32, "text": "by hash"}
            )
        first = await _transcribe(fake.base_url, note, model="whisper-1")
        second = await _transcribe(fake.base_url, other, model="whisper-1")
        unknown = await _transcribe(fake.base_url, b"OggS?", model="whisper-1")
        await _post(
            fake.base_url, {"model": "tts-1", "input": "hi", "voice": "nova"}, "/audio/speech"
        )
        async with httpx.AsyncClient(trust_env=False) as client:
            listed = (await client.get(f"{root}/_fake/audio_requests")).json()
    assert added.json() == {"sha256": audio.digest(other)}
    assert fake.transcripts["ab" * 32] == "by hash"
    assert [a.json()["text"] for a in (first, second, unknown)] == [
        "from the script",
        "posted",
        "?",
    ]
    assert [r["kind"] for r in listed] == ["transcription"] * 3 + ["speech"]
    assert listed[0]["sha256"] == audio.digest(note) and listed[0]["size"] == len(note)
    assert listed[0]["fields"] == [["model", "whisper-1"]]
    assert listed[3]["body"]["voice"] == "nova"


async def test_the_gpt_4o_models_take_json_or_text_and_count_tokens() -> None:
    note = audio.ogg_opus(2.0)
    async with FakeLLM() as fake:
        fake.add_transcript(note, "spoken words")
        model = "gpt-4o-mini-transcribe"
        verbose = await _transcribe(
            fake.base_url, note, model=model, response_format="verbose_json"
        )
        plain = await _transcribe(fake.base_url, note, model=model)
    assert verbose.status_code == 400
    assert verbose.json()["error"]["message"] == (
        "response_format 'verbose_json' is not compatible with model 'gpt-4o-mini-transcribe'. "
        "Use 'json' or 'text' instead."
    )
    usage = plain.json()["usage"]
    assert usage["type"] == "tokens" and usage["input_token_details"]["audio_tokens"] == 20
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
