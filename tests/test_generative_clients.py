"""Issue 39's serving done-when, each against a real server socket (agent.yaml -> start_fronts, the daemon's path)
and the decoder made in code run by onnxruntime-genai: the `openai` Python client and `curl -N` unchanged; 8
streaming clients that fit the KV budget all finish while a ninth gets 503 with the reason (the budget set from the
charge the server reports on /metrics); a client that hangs up mid-stream frees its slot within a second (seen on
/metrics); and the per-model token counters and TTFT/TPOT histograms read back from /metrics."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agent.config.load import parse_config
from agent.generative.samples import write_generative_package
from agent.serving.fronts import start_fronts
from agent.serving.registry import ModelRegistry

pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (edge-agent[genai])")
openai = pytest.importorskip("openai", reason="the openai client is a test dependency (edge-agent[test])")
TOKEN = "a-token-of-at-least-16-chars"
LONG_MAX = 2048
LONG_TOKENS = 1600  # a held stream's SSE: ~90 KB here, 4x what a held client's connection buffers (~23 KB) ...
EACH = {"stream_interval_ms": 0}  # ... sent a piece a token: paced (20 ms), the tiny model's 1600 tokens go out in
# a few pieces that the buffers hold whole, and the held stream ends (issue 39's CI run of 6 December 2026)


def _serve(root: Path, models: dict, **generative):
    (root / "token").write_text(TOKEN)
    raw = {"port": 0, "grpc_port": None, "token_file": str(root / "token")}
    cfg = parse_config({"serving": {**raw, "generative": {"models": models, **generative}}}, base_dir=root)
    reg = ModelRegistry()
    srv, _ = start_fronts(reg, cfg.serving)
    return srv, reg


def _long_package(root: Path) -> Path:
    """The tiny decoder with EOS held off to max_length (onnxruntime-genai's own search.min_length): every greedy
    request runs to its max_tokens, so a stream's length is known."""
    pkg = write_generative_package(root / "long", variants=(), max_length=LONG_MAX, name="long")
    cfg = json.loads((pkg / "genai_config.json").read_text())
    cfg["search"]["min_length"] = LONG_MAX
    (pkg / "genai_config.json").write_text(json.dumps(cfg))
    return pkg


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("genc")
    models = {
        "tiny-lm": {"package": str(write_generative_package(root / "tiny", variants=()))},
        "long": {"package": str(_long_package(root))},
    }
    srv, reg = _serve(root, models, max_streams=12, **EACH)
    try:
        yield srv
    finally:
        assert srv.shutdown(10)
        reg.close()


def _held(srv, doc: dict) -> tuple[socket.socket, http.client.HTTPResponse]:
    """A streaming client that reads nothing past the head until told: its connection advertises a small window (MSS
    256, 1 KiB receive buffer), so the server's sends block once a few tens of KB wait, and the generation holds its
    slot meanwhile: "in flight" without depending on how fast this host generates."""
    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 256)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.settimeout(120)
    sock.connect(("127.0.0.1", srv.port))
    conn = http.client.HTTPConnection("127.0.0.1", srv.port)
    conn.sock = sock
    conn.request("POST", "/v1/completions", json.dumps({**doc, "stream": True}), {"Authorization": f"Bearer {TOKEN}"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    return sock, resp


def _request(srv, method: str, path: str, doc: dict | None = None) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    conn.request(method, path, None if doc is None else json.dumps(doc), headers)
    return conn.getresponse()


def metrics(srv) -> dict[str, float]:
    """/metrics as {'name{labels}': value} for the generation families."""
    text = _request(srv, "GET", "/metrics").read().decode()
    pairs = (ln.rsplit(" ", 1) for ln in text.splitlines() if ln.startswith("edge_agent_generation"))
    return {k: float(v) for k, v in pairs}


def _events(resp: http.client.HTTPResponse) -> list:
    assert resp.status == 200, resp.read()
    blocks = resp.read().decode().split("\n\n")
    return [b[6:] if b == "data: [DONE]" else json.loads(b[6:]) for b in blocks if b.startswith("data: ")]


def _poll(srv, key: str, want: float, within_s: float) -> tuple[float, float]:
    """Read /metrics until `key` equals `want` or `within_s` pass: (its last value, seconds it took)."""
    t0 = time.monotonic()
    while True:
        got = metrics(srv)[key]
        if got == want or time.monotonic() - t0 > within_s:
            return got, time.monotonic() - t0
        time.sleep(0.005)


def test_the_openai_client_works_unchanged(server) -> None:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=TOKEN, max_retries=0)
    assert {m.id for m in client.models.list()} == {"tiny-lm", "long"}
    msgs = [{"role": "user", "content": "Say hi"}]
    chat = client.chat.completions.create(model="tiny-lm", messages=msgs, max_tokens=12, temperature=0)
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens >= 1 and chat.choices[0].finish_reason in ("length", "stop")
    chunks = list(
        client.chat.completions.create(model="tiny-lm", messages=msgs, max_tokens=12, temperature=0, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == chat.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == chat.choices[0].finish_reason
    whole = client.completions.create(model="tiny-lm", prompt="Hello, edge", max_tokens=12, temperature=0)
    assert whole.object == "text_completion" and whole.usage.prompt_tokens == len("Hello, edge")
    parts = client.completions.create(model="tiny-lm", prompt="Hello, edge", max_tokens=12, temperature=0, stream=True)
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text
    with pytest.raises(openai.AuthenticationError):  # the inference port's token guards these routes
        openai.OpenAI(base_url=client.base_url, api_key="wrong-token-0123456789", max_retries=0).models.list()


def test_curl_gets_the_generate_stream_events(server) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    doc = {"text_input": "Hello, edge", "parameters": {"max_tokens": 12, "temperature": 0}}
    url = f"http://127.0.0.1:{server.port}/v2/models/tiny-lm/generate_stream"
    auth = f"Authorization: Bearer {TOKEN}"
    r = subprocess.run([curl, "-sSN", "-H", auth, url, "-d", json.dumps(doc)], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    events = [json.loads(b[6:]) for b in r.stdout.decode().split("\n\n") if b.startswith("data: ")]
    assert events and all(e["model_name"] == "tiny-lm" for e in events)
    whole = json.loads(_request(server, "POST", "/v2/models/tiny-lm/generate", doc).read())
    assert "".join(e["text_output"] for e in events) == whole["text_output"]
    assert events[-1]["finish_reason"] == whole["finish_reason"]
    assert all("finish_reason" not in e for e in events[:-1])


def test_metrics_count_tokens_and_time_them_per_model(server) -> None:
    lab = '{model="tiny-lm"}'
    before = metrics(server)
    doc = {"model": "tiny-lm", "prompt": "Count me", "max_tokens": 10, "temperature": 0}
    usage = json.loads(_request(server, "POST", "/v1/completions", doc).read())
    after = metrics(server)

    def grew(name: str) -> float:
        return after[f"edge_agent_generation_{name}{lab}"] - before[f"edge_agent_generation_{name}{lab}"]

    finish, done = usage["choices"][0]["finish_reason"], usage["usage"]["completion_tokens"]
    assert grew("requests_total") == 1 and grew("prompt_tokens_total") == usage["usage"]["prompt_tokens"]
    assert grew("completion_tokens_total") == done
    assert grew("ttft_seconds_count") == 1 and grew("ttft_seconds_sum") > 0
    # every token after the first is one TPOT sample (an EOS that ended it was generated, not returned)
    assert grew("tpot_seconds_count") == (done - 1 if finish == "length" else done)
    buckets = [v for k, v in after.items() if k.startswith('edge_agent_generation_tpot_seconds_bucket{model="tiny-lm"')]
    assert buckets == sorted(buckets) and buckets[-1] == after[f"edge_agent_generation_tpot_seconds_count{lab}"]
    assert 'edge_agent_generation_requests_total{model="long"}' in after  # one series per model served


def _charge(srv, doc: dict) -> int:
    """What the server charges the KV budget for a request like `doc`: the growth of its kv_reserved_bytes_total."""
    key = f'edge_agent_generation_kv_reserved_bytes_total{{model="{doc["model"]}"}}'
    before = metrics(srv)[key]
    whole = json.loads(_request(srv, "POST", "/v1/completions", doc).read())
    assert whole["choices"][0]["finish_reason"] == "length" and whole["usage"]["completion_tokens"] == doc["max_tokens"]
    return int(metrics(srv)[key] - before)


def test_eight_streams_that_fit_finish_and_a_ninth_gets_503_with_the_reason(server, tmp_path) -> None:
    doc = {"model": "long", "prompt": "Hello", "max_tokens": LONG_TOKENS, "temperature": 0}
    charge = _charge(server, doc)
    budget = 8 * charge + charge // 2  # 8 such requests fit, 9 do not
    srv, reg = _serve(tmp_path, {"long": {"package": str(_long_package(tmp_path))}}, kv_budget=budget, max_streams=12,
                      **EACH)  # fmt: skip
    try:
        streams = [_held(srv, doc)[1] for _ in range(8)]
        m = metrics(srv)
        assert (
            m["edge_agent_generation_streams_in_flight"] == 8 and m["edge_agent_generation_kv_held_bytes"] == 8 * charge
        )
        ninth = _request(srv, "POST", "/v1/completions", {**doc, "stream": True})
        assert ninth.status == 503 and ninth.getheader("Retry-After") == "1", ninth.status
        reason = json.loads(ninth.read())["error"]
        assert f"needs {charge} bytes of KV cache; {8 * charge} of the {budget}-byte budget" in reason
        assert "serving.generative.kv_budget" in reason and "8 stream(s) in flight" in reason
        done: list[list] = []
        readers = [threading.Thread(target=lambda r=r: done.append(_events(r))) for r in streams]
        for t in readers:
            t.start()
        for t in readers:
            t.join(120)
        assert len(done) == 8
        for events in done:
            assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
        after, lab = metrics(srv), '{model="long"}'
        assert after["edge_agent_generation_streams_in_flight"] == 0 == after["edge_agent_generation_kv_held_bytes"]
        assert after[f"edge_agent_generation_refused_total{lab}"] == 1
        assert after[f"edge_agent_generation_completion_tokens_total{lab}"] == 8 * LONG_TOKENS
    finally:
        assert srv.shutdown(10)
        reg.close()


def test_a_client_that_hangs_up_mid_stream_frees_its_slot_within_a_second(server) -> None:
    lab = '{model="long"}'
    before = metrics(server)
    sock, resp = _held(server, {"model": "long", "prompt": "Hello", "max_tokens": LONG_TOKENS, "temperature": 0})
    assert resp.readline().startswith(b"data: ")  # tokens are coming
    assert metrics(server)["edge_agent_generation_streams_in_flight"] == 1
    sock.close()  # hang up mid-stream (unread data left: the kernel resets the server's send)
    resp.close()  # (the socket's file was the last user of it: closed now)
    streams, took = _poll(server, "edge_agent_generation_streams_in_flight", 0, within_s=1.0)
    assert streams == 0, f"the slot was still held {took:.2f} s after the client hung up"
    after = metrics(server)
    assert after["edge_agent_generation_kv_held_bytes"] == 0
    grew = {
        k: after[f"edge_agent_generation_{k}{lab}"] - before[f"edge_agent_generation_{k}{lab}"]
        for k in ("cancelled_total", "completion_tokens_total")
    }
    assert grew["cancelled_total"] == 1
    assert grew["completion_tokens_total"] < LONG_TOKENS  # it stopped there, it did not run on to max_tokens
