"""Every endpoint and parameter of the OpenAI-compatible server, through the official client."""
import json

import pytest

from conftest import fake_only


def sse_events(raw: bytes):
    """Splits an SSE body into its data payloads, checking the framing."""
    text = raw.decode()
    assert text.endswith("\n\n"), "every event ends with a blank line"
    events = text.split("\n\n")[:-1]
    out = []
    for ev in events:
        assert ev.startswith("data: "), ev
        assert "\n" not in ev, "one data line per event"
        out.append(ev[len("data: "):])
    assert out[-1] == "[DONE]"
    return out[:-1]


def test_health(server):
    status, _, body = server.request("GET", "/health", auth=False)
    assert status == 200


def test_models(client, server):
    models = client.models.list()
    assert len(models.data) == 1
    card = models.data[0]
    assert card.object == "model"
    assert card.owned_by == "moeserve"
    assert client.models.retrieve(card.id).id == card.id
    status, body = server.json("GET", "/v1/models")
    assert body["data"][0]["max_model_len"] == server.max_model_len


def test_completion_basic(client, model):
    r = client.completions.create(model=model, prompt="Hello", max_tokens=7, temperature=0)
    assert r.object == "text_completion"
    assert len(r.choices) == 1
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 7
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_length(client, model):
    r = client.completions.create(model=model, prompt="Hello", max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5


def test_completion_stream_equals_non_stream(client, model, server):
    kw = dict(model=model, prompt="Once upon a time", max_tokens=24, temperature=0)
    full = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_completion_stream_framing_and_usage(server, model):
    status, headers, raw = server.request(
        "POST", "/v1/completions",
        {"model": model, "prompt": "abc", "max_tokens": 6, "temperature": 0, "stream": True,
         "stream_options": {"include_usage": True}, "ignore_eos": True})
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    events = [json.loads(e) for e in sse_events(raw)]
    usage = events[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    for e in events[:-1]:
        assert e["usage"] is None
        assert e["object"] == "text_completion"
    assert usage["usage"]["total_tokens"] == (usage["usage"]["prompt_tokens"] + 6)


def test_chat_basic(client, model):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0)
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant"
    assert isinstance(msg.content, str)
    assert r.usage.completion_tokens <= 8


def test_chat_max_completion_tokens(client, model):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=3,
        temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    assert r.choices[0].finish_reason == "length"


def test_chat_stream_equals_non_stream(client, model):
    kw = dict(model=model, messages=[{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "Tell me a story"}],
              max_tokens=32, temperature=0)
    full = client.chat.completions.create(**kw).choices[0].message.content
    stream = list(client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kw))
    assert stream[0].choices[0].delta.role == "assistant"
    text = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    assert text == full
    assert stream[-1].usage is not None and stream[-1].usage.completion_tokens > 0


def test_sampling_params_accepted(client, model):
    r = client.completions.create(
        model=model, prompt="x", max_tokens=4, temperature=0.7, top_p=0.9, seed=1,
        presence_penalty=0.5, frequency_penalty=0.5, user="u1",
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 1})
    assert len(r.choices) == 1


def test_seed_is_deterministic(client, model):
    kw = dict(model=model, prompt="seeded", max_tokens=16, temperature=1.0, seed=1234)
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    assert a == b


def test_n_choices(client, model):
    r = client.completions.create(model=model, prompt="n", max_tokens=4, n=3, temperature=0)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "n"}],
                                       max_tokens=4, n=2, temperature=0)
    assert sorted(c.index for c in r.choices) == [0, 1]


def test_n_choices_stream(client, model):
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "n"}], max_tokens=5, n=2,
        temperature=0, stream=True))
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_batched_prompts(client, model):
    r = client.completions.create(model=model, prompt=["a", "b"], max_tokens=3, temperature=0)
    assert sorted(c.index for c in r.choices) == [0, 1]
    r = client.completions.create(model=model, prompt=[[72, 105]], max_tokens=3, temperature=0)
    assert len(r.choices) == 1


def test_completion_logprobs(client, model):
    r = client.completions.create(model=model, prompt="lp", max_tokens=4, temperature=0,
                                  logprobs=2, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.token_logprobs) == 4
    assert all(len(t) <= 2 for t in lp.top_logprobs)
    assert all(x <= 0 for x in lp.token_logprobs)


def test_chat_logprobs(client, model):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "lp"}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 3
    assert all(len(c.top_logprobs) == 3 for c in content)
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "lp"}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=1, stream=True, extra_body={"ignore_eos": True}))
    n = sum(len(c.choices[0].logprobs.content) for c in chunks
            if c.choices and c.choices[0].logprobs)
    assert n == 3


def test_echo(client, model):
    r = client.completions.create(model=model, prompt="echo me", max_tokens=2, temperature=0,
                                  echo=True)
    assert r.choices[0].text.startswith("echo me")
    r = client.completions.create(model=model, prompt="echo me", max_tokens=0, echo=True)
    assert r.choices[0].text == "echo me"


def test_echo_with_logprobs(client, model):
    """echo + logprobs: the prompt's tokens lead, with null logprobs (no prompt logprobs here)."""
    kw = dict(model=model, prompt="echo me", max_tokens=3, temperature=0, echo=True, logprobs=1)
    r = client.completions.create(**kw)
    lp, n_prompt = r.choices[0].logprobs, r.usage.prompt_tokens
    assert len(lp.tokens) == n_prompt + r.usage.completion_tokens
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(lp.tokens)
    assert lp.token_logprobs[:n_prompt] == [None] * n_prompt
    assert lp.top_logprobs[:n_prompt] == [None] * n_prompt
    assert all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[n_prompt:])
    assert lp.text_offset == sorted(lp.text_offset)
    if r.usage.completion_tokens:
        assert lp.text_offset[n_prompt] == len("echo me")
    chunks = list(client.completions.create(stream=True, **kw))
    tokens, token_lps, offsets = [], [], []
    for c in chunks:
        if c.choices and c.choices[0].logprobs:
            tokens += c.choices[0].logprobs.tokens
            token_lps += c.choices[0].logprobs.token_logprobs
            offsets += c.choices[0].logprobs.text_offset
    assert tokens == lp.tokens and token_lps == lp.token_logprobs and offsets == lp.text_offset


def test_tokenize_detokenize(server, model):
    status, body = server.json("POST", "/tokenize", {"model": model, "prompt": "Hello world"})
    assert status == 200
    assert body["count"] == len(body["tokens"]) > 0
    assert body["max_model_len"] == server.max_model_len
    status, back = server.json("POST", "/detokenize", {"model": model, "tokens": body["tokens"]})
    assert status == 200
    assert "Hello world" in back["prompt"]
    status, body = server.json("POST", "/tokenize", {
        "messages": [{"role": "user", "content": "hi"}], "return_token_strs": True})
    assert status == 200 and len(body["token_strs"]) == body["count"]


def test_unknown_fields_ignored(server, model):
    status, body = server.json("POST", "/v1/completions", {
        "model": model, "prompt": "x", "max_tokens": 2, "some_future_field": {"a": 1}})
    assert status == 200, body


def test_metrics(server, client, model):
    client.completions.create(model=model, prompt="metrics", max_tokens=3, temperature=0)
    m = server.metrics()
    names = {k.split("{")[0] for k in m}
    for name in ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "prefix_cache_queries", "prefix_cache_hits", "prompt_tokens_total",
                 "generation_tokens_total", "request_success_total",
                 "time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket",
                 "e2e_request_latency_seconds_count", "request_prompt_tokens_sum",
                 "request_generation_tokens_count"]:
        assert "moeserve:" + name in names, name
    assert server.metric("moeserve:generation_tokens_total") >= 3
    assert server.metric("moeserve:request_success_total", 'finished_reason="length"') >= 1
    assert 'model_name="' in next(k for k in m if k.startswith("moeserve:prompt_tokens_total"))


def test_keep_alive(server):
    import http.client
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    for _ in range(3):
        conn.request("GET", "/health")
        r = conn.getresponse()
        assert r.status == 200
        r.read()
    conn.close()


def test_stop_string_cuts_the_greedy_output(client, model):
    """Model-agnostic stop strings: a substring of the greedy output stops it right before."""
    kw = dict(model=model, prompt="Stop here", max_tokens=12, temperature=0)
    extra = {"ignore_eos": True}
    full = client.completions.create(extra_body=extra, **kw).choices[0].text
    stop = full.strip()[:3]
    if not stop:
        pytest.skip(f"greedy output has no text for a stop string: {full!r}")
    expected = full[:full.index(stop)]
    r = client.completions.create(stop=[stop], extra_body=extra, **kw)
    assert r.choices[0].text == expected
    assert r.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(stop=[stop], stream=True, extra_body=extra, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    r = client.completions.create(stop=[stop], **kw,
                                  extra_body={**extra, "include_stop_str_in_output": True})
    assert r.choices[0].text == expected + stop


# --- scripted behaviour (the fake engine emits the text after "say:") ---

@fake_only
def test_stop_strings(client, model):
    r = client.completions.create(model=model, prompt="say:hello world. bye", max_tokens=50,
                                  temperature=0, stop=["world"])
    assert r.choices[0].text == "hello "
    assert r.choices[0].finish_reason == "stop"
    r = client.completions.create(model=model, prompt="say:alpha beta gamma", max_tokens=50,
                                  temperature=0, stop=["zzz", "beta g"], stream=True)
    chunks = list(r)
    assert "".join(c.choices[0].text for c in chunks) == "alpha "
    assert chunks[-1].choices[0].finish_reason == "stop"
    r = client.completions.create(model=model, prompt="say:one two", max_tokens=50,
                                  temperature=0, stop="two",
                                  extra_body={"include_stop_str_in_output": True})
    assert r.choices[0].text == "one two"


@fake_only
def test_eos_stop(client, model):
    r = client.completions.create(model=model, prompt="say:short", max_tokens=50, temperature=0)
    assert r.choices[0].text == "short"
    assert r.choices[0].finish_reason == "stop"


@fake_only
def test_utf8_streaming_never_splits(client, model):
    text = "héllo wörld ✓ 🚀"
    chunks = list(client.completions.create(model=model, prompt="say:" + text, max_tokens=100,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
TOOL_TEXT = ('say:Checking.<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}'
             '</tool_call>')


@fake_only
def test_tool_calls(client, model):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": TOOL_TEXT}], tools=TOOLS,
        tool_choice="auto", max_tokens=200, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert len(calls) == 1 and calls[0].type == "function"
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert calls[0].id
    assert choice.message.content == "Checking."
    assert "tool_call" not in (choice.message.content or "")


@fake_only
def test_tool_calls_stream(client, model):
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": TOOL_TEXT}], tools=TOOLS,
        max_tokens=200, temperature=0, stream=True))
    content = "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)
    assert content == "Checking."
    name, args, ids = "", "", set()
    for c in chunks:
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if tc.id:
                ids.add(tc.id)
            if tc.function and tc.function.name:
                name += tc.function.name
            if tc.function and tc.function.arguments:
                args += tc.function.arguments
    assert name == "get_weather" and json.loads(args) == {"city": "Paris"} and len(ids) == 1
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@fake_only
def test_tool_history_round_trip(client, model):
    r = client.chat.completions.create(model=model, tools=TOOLS, max_tokens=20, temperature=0,
                                       messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "say:sunny"}])
    assert r.choices[0].message.content == "sunny"


@fake_only
def test_tool_choice_none_leaves_markup_as_content(client, model):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": TOOL_TEXT}], tools=TOOLS,
        tool_choice="none", max_tokens=200, temperature=0)
    assert r.choices[0].message.tool_calls is None or r.choices[0].message.tool_calls == []
    assert r.choices[0].finish_reason == "stop"


@fake_only
def test_reasoning_content(client, model):
    kw = dict(model=model, max_tokens=200, temperature=0,
              messages=[{"role": "user", "content": "say:Two plus two.</think>It is 4."}],
              extra_body={"chat_template_kwargs": {"thinking": True}})
    r = client.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert msg.content == "It is 4."
    assert msg.model_extra["reasoning_content"] == "Two plus two."
    chunks = list(client.chat.completions.create(stream=True, **kw))
    reasoning = "".join((c.choices[0].delta.model_extra.get("reasoning_content") or "")
                        for c in chunks if c.choices)
    content = "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)
    assert reasoning == "Two plus two." and content == "It is 4."
