"""tool_choice on the real engine service (DeepSeek-V4 chat encoding, DSML tool calls).

The embedded model has random weights, so it never writes DSML on its own: these tests check
what the server guarantees whatever the model writes. `none` keeps the tools out of the prompt;
`required` and a named function force the assistant turn to open a DSML tool call in the prompt,
and the answer is a tool call even when the continuation is not well-formed DSML.
"""
import json

import pytest

from conftest import real_only

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_TOKENS = 6


def chat(client, model, **kw):
    return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS,
                                          temperature=0, **kw)


def tokens(server, **kw):
    status, body = server.json("POST", "/tokenize", {"messages": MESSAGES, **kw})
    assert status == 200, body
    return body


def stream_calls(chunks):
    """Reassembles streamed tool calls: {index: [id, name, arguments]}."""
    calls = {}
    for c in chunks:
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = calls.setdefault(tc.index, ["", "", ""])
            if tc.id:
                entry[0] = tc.id
            if tc.function and tc.function.name:
                entry[1] += tc.function.name
            if tc.function and tc.function.arguments:
                entry[2] += tc.function.arguments
    return calls


@real_only
def test_tool_choice_none_offers_no_tools(server, client, model):
    plain = chat(client, model)
    none = chat(client, model, tools=[WEATHER, TIME], tool_choice="none")
    auto = chat(client, model, tools=[WEATHER, TIME], tool_choice="auto")
    # none: the tools are not in the prompt at all; auto: they are.
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens
    assert tokens(server, tools=[WEATHER], tool_choice="none")["count"] == tokens(server)["count"]
    # Same prompt, greedy: the same text, and no tool calls.
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert not none.choices[0].message.tool_calls
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")


@real_only
def test_tool_choice_named_forces_the_call(server, client, model):
    choice = {"type": "function", "function": {"name": "get_time"}}
    r = chat(client, model, tools=[WEATHER, TIME], tool_choice=choice)
    c = r.choices[0]
    assert c.finish_reason in ("tool_calls", "length")
    calls = c.message.tool_calls
    assert len(calls) == 1
    assert calls[0].type == "function" and calls[0].id.startswith("call_")
    assert calls[0].function.name == "get_time"
    assert isinstance(calls[0].function.arguments, str)
    assert r.usage.completion_tokens <= MAX_TOKENS
    # The prompt ends with the forced DSML opening naming the function.
    forced = tokens(server, tools=[WEATHER, TIME], tool_choice=choice, return_token_strs=True)
    auto = tokens(server, tools=[WEATHER, TIME], tool_choice="auto")
    assert forced["count"] > auto["count"]
    assert r.usage.prompt_tokens == forced["count"]
    tail = "".join(forced["token_strs"][auto["count"]:])
    assert "DSML" in tail and 'name="get_time">' in tail, tail
    # Streaming: the same call (temperature 0), whole, and the same finish reason.
    chunks = list(chat(client, model, tools=[WEATHER, TIME], tool_choice=choice, stream=True))
    streamed = stream_calls(chunks)
    assert list(streamed) == [0]
    sid, name, args = streamed[0]
    assert sid and name == "get_time" and args == calls[0].function.arguments
    assert chunks[-1].choices[0].finish_reason == c.finish_reason
    assert "".join((ch.choices[0].delta.content or "") for ch in chunks if ch.choices) == ""


@real_only
def test_tool_choice_required_single_tool_names_it(client, model):
    r = chat(client, model, tools=[WEATHER], tool_choice="required")
    calls = r.choices[0].message.tool_calls
    assert len(calls) >= 1
    assert calls[0].function.name == "get_weather"
    assert r.choices[0].finish_reason in ("tool_calls", "length")


@real_only
def test_tool_choice_required_returns_a_call(server, client, model):
    r = chat(client, model, tools=[WEATHER, TIME], tool_choice="required")
    calls = r.choices[0].message.tool_calls
    assert calls and len(calls) >= 1
    for call in calls:
        assert call.type == "function" and call.id
        assert isinstance(call.function.name, str) and isinstance(call.function.arguments, str)
    assert r.choices[0].finish_reason in ("tool_calls", "length")
    # The forced opening stops inside `invoke name="`: the model writes the name.
    forced = tokens(server, tools=[WEATHER, TIME], tool_choice="required", return_token_strs=True)
    assert "".join(forced["token_strs"]).endswith('invoke name="')


@real_only
def test_tool_choice_in_thinking_mode_closes_reasoning(client, model):
    r = chat(client, model, tools=[WEATHER], tool_choice="required",
             extra_body={"chat_template_kwargs": {"thinking": True}})
    msg = r.choices[0].message
    assert msg.tool_calls and msg.tool_calls[0].function.name == "get_weather"
    assert not (msg.model_extra.get("reasoning_content") or "")


@real_only
def test_no_false_engram_warning_at_load(server):
    with open(server.log_path, errors="replace") as f:
        log = f.read()
    assert "Engram token map derived from the tokenizer" in log
    assert "pad-only" not in log, log[-2000:]
