"""The OpenAI-compatible routes (docs/generative.md) on a real HTTP server and the tiny decoder made in code run by
onnxruntime-genai: completions and chat, streamed (SSE) and not, the inference port's token, the KV-memory budget's
503 with its reason, and a client that hangs up ending its generation. The server comes from an agent.yaml through
the same path the daemon takes (config -> start_fronts)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from agent.config.load import parse_config
from agent.generative.samples import write_generative_package
from agent.serving.fronts import start_fronts
from agent.serving.generative.engine import Sampling, Usage
from agent.serving.generative.pacing import DEFAULT_STREAM_INTERVAL_S
from agent.serving.generative.stream import GenerationStream
from agent.serving.http.wire import send_stream
from agent.serving.registry import ModelRegistry

pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (edge-agent[genai])")
TOKEN = "a-token-of-at-least-16-chars"
PER_TOKEN = 2 * 2 * 2 * 16 * 4  # keys and values x 2 layers x 2 heads x head size 16 x fp32


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("gens")
    pkg = write_generative_package(root / "tiny", variants=("int8",))
    (root / "token").write_text(TOKEN)
    budget = 4 * PER_TOKEN * 64  # four requests of 64 tokens (prompt + max_tokens) at once
    cfg = parse_config(
        {
            "serving": {
                "port": 0,
                "grpc_port": None,
                "token_file": str(root / "token"),
                "generative": {"kv_budget": budget, "models": {"tiny-lm": {"package": str(pkg), "variant": "int8"}}},
            }
        },
        base_dir=root,
    )
    reg = ModelRegistry()
    srv, _ = start_fronts(reg, cfg.serving)
    try:
        yield srv
    finally:
        assert srv.shutdown(10)
        reg.close()


def _post(srv, path: str, doc: dict, token: str | None = TOKEN) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    conn.request("POST", path, json.dumps(doc), headers)
    return conn.getresponse()


def _events(resp: http.client.HTTPResponse) -> list:
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    out = []
    for block in resp.read().decode().split("\n\n"):
        if block.strip() and not block.startswith(":"):  # ": keep-alive" comments are not events
            assert block.startswith("data: ")
            out.append(block[6:] if block[6:] == "[DONE]" else json.loads(block[6:]))
    return out


def test_completions_streamed_and_not_agree(server) -> None:
    doc = {"model": "tiny-lm", "prompt": "Hello, edge", "max_tokens": 12, "temperature": 0}
    whole = json.loads(_post(server, "/v1/completions", doc).read())
    assert whole["object"] == "text_completion" and whole["usage"]["prompt_tokens"] == len("Hello, edge")
    choice = whole["choices"][0]
    assert choice["finish_reason"] in ("length", "stop")
    assert whole["usage"]["completion_tokens"] == (
        12 if choice["finish_reason"] == "length" else whole["usage"]["completion_tokens"]
    )
    events = _events(_post(server, "/v1/completions", {**doc, "stream": True}))
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == choice["finish_reason"]
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == choice["text"]


def test_chat_stream_and_models(server) -> None:
    doc = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 10, "temperature": 0}
    whole = json.loads(_post(server, "/v1/chat/completions", doc).read())
    assert whole["object"] == "chat.completion" and whole["model"] == "tiny-lm"
    events = _events(_post(server, "/v1/chat/completions", {**doc, "stream": True}))
    assert events[0]["choices"][0]["delta"]["role"] == "assistant" and events[-1] == "[DONE]"
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == whole["choices"][0]["message"]["content"]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
    assert [m["id"] for m in json.loads(conn.getresponse().read())["data"]] == ["tiny-lm"]


def test_stop_sampling_and_refusals(server) -> None:
    greedy = json.loads(_post(server, "/v1/completions", {"prompt": "abc", "max_tokens": 20, "temperature": 0}).read())
    text = greedy["choices"][0]["text"]
    if len(text) > 3:  # stop at a string the greedy text holds: the text ends before it
        stop = text[2:4]
        cut = json.loads(
            _post(server, "/v1/completions", {"prompt": "abc", "max_tokens": 20, "temperature": 0, "stop": stop}).read()
        )
        assert cut["choices"][0]["text"] == text[: text.find(stop)] and cut["choices"][0]["finish_reason"] == "stop"
    sampled = _post(server, "/v1/completions", {"prompt": "abc", "max_tokens": 5, "temperature": 0.8, "top_p": 0.9})
    assert sampled.status == 200
    assert _post(server, "/v1/completions", {"prompt": "abc"}, token=None).status == 401
    assert _post(server, "/v1/completions", {"prompt": "abc", "max_tokens": 0}).status == 400
    assert _post(server, "/v1/completions", {"model": "nope", "prompt": "abc"}).status == 404


def test_kv_budget_refuses_with_the_reason_and_frees_it(server) -> None:
    model = server.plane.generation.models["tiny-lm"]
    held = [model.reserve([1] * 4, Sampling(max_tokens=60)) for _ in range(4)]  # four streams in flight
    try:
        resp = _post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 8})
        assert resp.status == 503 and resp.getheader("Retry-After") == "1"
        assert "KV-memory budget" in json.loads(resp.read())["error"]
    finally:
        for lease in held:
            lease.release()
    assert _post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 8}).status == 200
    assert model.budget.held == 0 and model.budget.streams == 0


def test_eight_concurrent_streams_finish(server) -> None:
    results: list[int] = []

    def one() -> None:
        ev = _events(_post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 8, "stream": True}))
        results.append(len(ev))

    threads = [threading.Thread(target=one) for _ in range(8)]  # 8 x 10 tokens fit the budget of 4 x 64
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 8 and all(n >= 2 for n in results)


def test_a_client_that_hangs_up_ends_its_generation(server) -> None:
    model = server.plane.generation.models["tiny-lm"]
    usage = Usage()
    lease = model.reserve([104, 105], Sampling(max_tokens=60))
    pieces = model.generate([104, 105], Sampling(max_tokens=60, temperature=0), usage, lease)
    a, b = socket.socketpair()
    b.close()  # the client is gone before the first piece
    with pytest.raises(OSError):
        send_stream(a, GenerationStream((p.encode() or b"-" for p in pieces), pieces, lease))
    a.close()
    assert usage.completion_tokens < 60 and model.budget.held == 0  # the generation ended, its KV budget freed
    # a stream closed before its first piece (the client went before the head was sent) frees its lease too
    lease = model.reserve([104, 105], Sampling(max_tokens=60))
    pieces = model.generate([104, 105], Sampling(max_tokens=60), Usage(), lease)
    GenerationStream((p.encode() for p in pieces), pieces, lease).close()
    assert model.budget.held == 0 and model.budget.streams == 0


def test_a_stream_is_paced_by_stream_interval_ms(server) -> None:
    """serving.generative.stream_interval_ms for onnxruntime-genai (which generates on the request's thread): a
    stream's text goes out in a first piece at once, then at most every interval (the text made meanwhile held
    for the next piece); at 0 a piece a token; the text is the same, and a request read whole is not paced."""
    model = server.plane.generation.models["tiny-lm"]
    prompt, sampling = [104, 105], Sampling(max_tokens=60, temperature=0)

    def texts(interval: float, streamed: bool = True) -> tuple[list[str], float, int]:
        model.stream_interval_s = interval
        usage, lease = Usage(), model.reserve(prompt, sampling)
        t0 = time.monotonic()
        out = [p for p in model.generate(prompt, sampling, usage, lease, streamed=streamed) if p]
        return out, time.monotonic() - t0, usage.completion_tokens

    try:
        each, _, made = texts(0.0)
        paced, took, _ = texts(0.02)
        whole, _, _ = texts(0.02, streamed=False)
    finally:
        model.stream_interval_s = DEFAULT_STREAM_INTERVAL_S
    assert made >= 20 and "".join(paced) == "".join(each) == "".join(whole), (made, paced, each)
    assert len(each) >= made // 4 and len(whole) >= made // 4, (len(each), len(whole), made)  # not paced
    assert 1 <= len(paced) <= 2 + took / 0.02, (len(paced), took)
    assert len(paced) < len(each) or 2 + took / 0.02 >= made // 4, (len(paced), len(each), made, took)
    assert model.budget.held == 0


def test_metrics_count_tokens_and_cancellations(server) -> None:
    assert _post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 4, "temperature": 0}).status == 200
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    lines = dict(
        line.rsplit(" ", 1)
        for line in conn.getresponse().read().decode().splitlines()
        if line.startswith("edge_agent_gen")
    )
    lab = '{model="tiny-lm"}'
    assert float(lines[f"edge_agent_generation_requests_total{lab}"]) >= 1
    assert float(lines[f"edge_agent_generation_completion_tokens_total{lab}"]) >= 1
    assert float(lines[f"edge_agent_generation_ttft_seconds_count{lab}"]) >= 1
    assert 'edge_agent_generation_tpot_seconds_bucket{model="tiny-lm",le="+Inf"}' in lines


def test_triton_generate_and_generate_stream(server) -> None:
    doc = {"text_input": "Hello, edge", "parameters": {"max_tokens": 12, "temperature": 0}}
    whole = json.loads(_post(server, "/v2/models/tiny-lm/generate", doc).read())
    assert whole["model_name"] == "tiny-lm" and whole["finish_reason"] in ("length", "stop")
    events = _events(_post(server, "/v2/models/tiny-lm/generate_stream", doc))
    assert events[-1]["finish_reason"] == whole["finish_reason"]
    assert "".join(e["text_output"] for e in events) == whole["text_output"]
    # the same text as the OpenAI route gives for the same greedy request
    same = json.loads(
        _post(server, "/v1/completions", {"prompt": "Hello, edge", "max_tokens": 12, "temperature": 0}).read()
    )
    assert same["choices"][0]["text"] == whole["text_output"]
    assert _post(server, "/v2/models/nope/generate", doc).status == 404
    assert _post(server, "/v2/models/tiny-lm/generate", {"parameters": {}}).status == 400


def test_a_ninth_stream_is_refused_naming_max_streams(server) -> None:
    model = server.plane.generation.models["tiny-lm"]
    held = [model.reserve([1, 2], Sampling(max_tokens=4)) for _ in range(8)]  # eight small streams in flight
    try:
        resp = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True})
        assert resp.status == 503 and "serving.generative.max_streams" in json.loads(resp.read())["error"]
    finally:
        for lease in held:
            lease.release()
    assert model.budget.streams == 0


def test_a_shared_kv_buffer_is_charged_at_max_length(tmp_path) -> None:
    from agent.generative.tinymodel import write_tiny_genai
    from agent.serving.generative.kvbudget import kv_shape

    grows = kv_shape(write_tiny_genai(tmp_path / "std", max_length=256))
    shared = kv_shape(write_tiny_genai(tmp_path / "gqa", max_length=256, gqa=True))
    assert grows.bytes_per_token == shared.bytes_per_token == PER_TOKEN
    assert grows.bytes_for(10) == 10 * PER_TOKEN and shared.bytes_for(10) == 256 * PER_TOKEN


def test_a_client_hanging_up_mid_stream_frees_its_slot_over_http(tmp_path) -> None:
    import time

    from agent.generative.tinymodel import write_tiny_genai

    pkg = write_tiny_genai(tmp_path / "slow", hidden=256, heads=4, layers=4, max_length=4096)  # ~1 ms a token here
    (pkg / "model.yaml").write_text(
        "name: slow\nkind: generative\nruntime: onnxruntime-genai\nmax_length: 4096\nprompts: [hi]\n"
        "timing: {prompt_lengths: [8]}\n"
    )
    cfg = parse_config(
        {"serving": {"port": 0, "grpc_port": None, "generative": {"models": {"slow": {"package": str(pkg)}}}}}
    )
    reg = ModelRegistry()
    srv, _ = start_fronts(reg, cfg.serving)
    try:
        model = srv.plane.generation.models["slow"]
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        body = json.dumps({"prompt": "Hello", "max_tokens": 4000, "stream": True, "temperature": 0}).encode()
        head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        sock.sendall(head + body)
        assert sock.recv(64).startswith(b"HTTP/1.1 200")  # the stream began
        assert model.budget.streams == 1
        sock.close()  # the client hangs up mid-generation
        deadline = time.monotonic() + 10
        while model.budget.streams and time.monotonic() < deadline:
            time.sleep(0.01)
        assert model.budget.streams == 0 and model.budget.held == 0
        assert model.stats.counts["cancelled_total"] == 1
        assert model.stats.counts["completion_tokens_total"] < 4000  # it stopped, it did not run to max_tokens
    finally:
        assert srv.shutdown(10)
        reg.close()


def test_a_request_waits_in_line_for_kv_room_when_queue_s_allows() -> None:
    from agent.serving.errors import ServerBusy
    from agent.serving.generative.kvbudget import KVBudget

    budget = KVBudget(1000, max_streams=8, queue_s=30)
    first = budget.lease(800, "the first")
    threading.Timer(0.05, first.release).start()  # room comes back while the second waits
    second = budget.lease(800, "the second")  # waits for it instead of a 503
    assert budget.held == 800 and budget.streams == 1
    short = KVBudget(1000, max_streams=8, queue_s=0.01)
    short.lease(800, "one")
    with pytest.raises(
        ServerBusy, match=r"KV-memory budget: two needs 800 .* \(waited 0\.01 s: serving\.generative\.queue_s\)"
    ):
        short.lease(800, "two")
    second.release()
    assert budget.held == 0 and budget.waiting == 0


def test_stream_interval_ms_is_read_with_its_bounds() -> None:
    from agent.errors import ConfigError

    def read(**g):
        return parse_config({"serving": {"port": 0, "generative": g}}).serving.generative.stream_interval_ms

    assert read() == 20.0 and read(stream_interval_ms=0) == 0.0 and read(stream_interval_ms=5.5) == 5.5
    for bad in (-1, 1001, "often"):
        with pytest.raises(ConfigError, match=r"serving\.generative\.stream_interval_ms"):
            read(stream_interval_ms=bad)
