"""Bad input → the documented 4xx with an OpenAI error object, and the server stays healthy."""
import json
import socket

import pytest


def check_error(server, status, data, want_status, param=None, code=None):
    assert status == want_status, data
    body = json.loads(data)
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    # The server is still healthy afterwards.
    assert server.request("GET", "/health")[0] == 200
    return err


def post(server, path, body, **kw):
    status, _, data = server.request("POST", path, body, **kw)
    return status, data


def test_malformed_json(server):
    s, d = post(server, "/v1/completions", '{"prompt": "x", ')
    check_error(server, s, d, 400, code="invalid_json")
    s, d = post(server, "/v1/chat/completions", "[1, 2]")
    check_error(server, s, d, 400)


@pytest.mark.parametrize("field,value,param", [
    ("temperature", "hot", "temperature"),
    ("max_tokens", "ten", "max_tokens"),
    ("n", 1.5, "n"),
    ("stream", "yes", "stream"),
    ("stop", 5, "stop"),
    ("seed", "s", "seed"),
    ("echo", 1, "echo"),
    ("logprobs", "two", "logprobs"),
    ("prompt", {"a": 1}, "prompt"),
])
def test_wrong_types_completions(server, field, value, param):
    body = {"prompt": "x", "max_tokens": 2, field: value}
    s, d = post(server, "/v1/completions", body)
    check_error(server, s, d, 400, param=param)


@pytest.mark.parametrize("field,value,param", [
    ("temperature", 2.5, "temperature"),
    ("temperature", -0.1, "temperature"),
    ("top_p", 0, "top_p"),
    ("top_p", 1.5, "top_p"),
    ("min_p", 2, "min_p"),
    ("top_k", -5, "top_k"),
    ("n", 0, "n"),
    ("n", 1000, "n"),
    ("max_tokens", -1, "max_tokens"),
    ("presence_penalty", 3, "presence_penalty"),
    ("frequency_penalty", -3, "frequency_penalty"),
    ("repetition_penalty", 0, "repetition_penalty"),
    ("logprobs", 50, "logprobs"),
])
def test_out_of_range(server, field, value, param):
    s, d = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2, field: value})
    check_error(server, s, d, 400, param=param)


def test_chat_validation(server):
    cases = [
        ({"max_tokens": 2}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
         "tools[0].function"),
        ({"messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
         "tools[0].function.name"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
         "tool_choice"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [],
          "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "x"}], "stream_options":
          {"include_usage": True}}, "stream_options"),
        ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []},
         "chat_template_kwargs"),
    ]
    for body, param in cases:
        s, d = post(server, "/v1/chat/completions", body)
        check_error(server, s, d, 400, param=param)


def test_unsupported_is_422(server):
    s, d = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]})
    check_error(server, s, d, 422, param="messages[0].content[0].type")
    s, d = post(server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}})
    check_error(server, s, d, 422, param="response_format")
    s, d = post(server, "/v1/completions", {"prompt": "x", "suffix": "y"})
    check_error(server, s, d, 422, param="suffix")


def test_unknown_model(server, client):
    s, d = post(server, "/v1/completions", {"model": "gpt-17", "prompt": "x"})
    check_error(server, s, d, 404, param="model", code="model_not_found")
    import openai
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_prompt_past_context(server, client, model):
    long_prompt = "word " * server.max_model_len
    s, d = post(server, "/v1/completions", {"prompt": long_prompt, "max_tokens": 1})
    check_error(server, s, d, 400, code="context_length_exceeded")
    s, d = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": server.max_model_len})
    check_error(server, s, d, 400, param="max_tokens", code="context_length_exceeded")
    s, d = post(server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": long_prompt}]})
    check_error(server, s, d, 400, code="context_length_exceeded")
    import openai
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt=long_prompt, max_tokens=1)


def test_token_ids_out_of_vocab(server):
    s, d = post(server, "/v1/completions", {"prompt": [1, 2, 10 ** 9], "max_tokens": 1})
    check_error(server, s, d, 400, param="prompt")
    s, d = post(server, "/detokenize", {"tokens": [10 ** 9]})
    check_error(server, s, d, 400, param="tokens")
    s, d = post(server, "/v1/completions", {"prompt": [-1], "max_tokens": 1})
    check_error(server, s, d, 400)


def test_oversized_body(server):
    body = json.dumps({"prompt": "x" * (40 << 20), "max_tokens": 1})
    try:
        s, d = post(server, "/v1/completions", body)
    except (ConnectionResetError, BrokenPipeError):
        pytest.fail("the server should answer 413 before closing")
    check_error(server, s, d, 413, code="request_too_large")


def test_invalid_utf8(server):
    body = b'{"prompt": "caf\xc3\x28", "max_tokens": 1}'
    s, d = post(server, "/v1/completions", body)
    check_error(server, s, d, 400, code="invalid_utf8")
    body = b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'
    s, d = post(server, "/v1/chat/completions", body)
    check_error(server, s, d, 400, code="invalid_utf8")
    # A lone surrogate escape is not valid text either.
    s, d = post(server, "/v1/completions", b'{"prompt": "\\ud800", "max_tokens": 1}')
    check_error(server, s, d, 400)


def test_unknown_path_and_method(server):
    s, _, d = server.request("GET", "/v1/nothing")
    check_error(server, s, d, 404, code="not_found")
    s, _, d = server.request("GET", "/nope", auth=False)
    check_error(server, s, d, 404)
    s, _, d = server.request("GET", "/v1/completions")
    check_error(server, s, d, 405)


def test_api_key(server):
    s, _, d = server.request("GET", "/v1/models", auth=False)
    check_error(server, s, d, 401, code="invalid_api_key")
    s, _, d = server.request("POST", "/v1/completions", {"prompt": "x"},
                             headers={"Authorization": "Bearer wrong"})
    err = check_error(server, s, d, 401, code="invalid_api_key")
    assert err["type"] == "authentication_error"
    # /health, /metrics, /tokenize are not under /v1 and stay open.
    assert server.request("GET", "/metrics", auth=False)[0] == 200
    import openai
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_malformed_http(server):
    with socket.create_connection((server.host, server.port), timeout=10) as s:
        s.sendall(b"GARBAGE\r\n\r\n")
        data = s.recv(65536)
    assert data.startswith(b"HTTP/1.1 400")
    assert server.request("GET", "/health")[0] == 200
