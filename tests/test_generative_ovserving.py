"""OpenVINO GenAI packages served by the daemon (issue 39; docs/generative.md, "Serving"): the tiny decoder made in
code in LLMPipeline's layout (agent.generative.tinyov), served from serving.generative over real HTTP through the
same path the daemon takes (config -> start_fronts), and deployed through a running daemon's lifecycle (inbox,
qualification through LLMPipeline, swap, probation, commit). Greedy output is checked against LLMPipeline's own
greedy generate on the same prompt; nothing is mocked. openvino-genai is in the `test` extra."""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
from support.agent import make_agent
from support.daemon import drop
from support.wait import wait_for

from agent.config.load import parse_config
from agent.generative.samples import write_openvino_package
from agent.serving.fronts import start_fronts
from agent.serving.registry import ModelRegistry

pytest.importorskip("openvino_genai", reason="openvino-genai is not installed (edge-agent[openvino-genai])")
TOKEN = "a-token-of-at-least-16-chars"
NAME = "lm"
TIMING = {"prompt_lengths": [16, 32], "tpot_tokens": 16, "repeats": 2, "greedy_tokens": 16}  # a short qualification


def pipeline_greedy(pkg: Path, text: str, tokens: int) -> tuple[list[int], str]:
    """LLMPipeline's own greedy tokens for `text` (f32 hints, as the package's fp32 row) and their text."""
    import openvino as ov
    import openvino_genai as ovg

    pipe = ovg.LLMPipeline(str(pkg), "CPU", INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")
    tok = pipe.get_tokenizer()
    ids = np.asarray([[int(t) for t in tok.encode(text).input_ids.data[0]]], np.int64)
    res = pipe.generate(ov.Tensor(ids), max_new_tokens=tokens, do_sample=False)
    out = [int(t) for t in res.tokens[0]]
    eos = pipe.get_generation_config().eos_token_id
    out = out[: out.index(eos)] if eos in out else out
    return out, str(tok.decode(out))


def pipeline_decode(pkg: Path, ids: list[int]) -> str:
    import openvino_genai as ovg

    return str(ovg.Tokenizer(str(pkg)).decode(ids))


def _start(root: Path, pkg: Path, **generative) -> tuple:
    (root / "token").write_text(TOKEN)
    cfg = parse_config(
        {
            "serving": {
                "port": 0,
                "grpc_port": None,
                "token_file": str(root / "token"),
                "generative": {"models": {"tiny-ov": {"package": str(pkg)}}, **generative},
            }
        },
        base_dir=root,
    )
    reg = ModelRegistry()
    srv, _ = start_fronts(reg, cfg.serving)
    return srv, reg


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("ovserve")
    pkg = write_openvino_package(root / "tiny-ov", variants=())
    srv, reg = _start(root, pkg)
    try:
        yield srv, pkg
    finally:
        assert srv.shutdown(10)
        reg.close()


def _post(port: int, path: str, doc: dict, token: str | None = TOKEN) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
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


def test_the_engine_is_openvino_genais(served) -> None:
    srv, _ = served
    model = srv.plane.generation.models["tiny-ov"]
    assert model.runtime == "openvino-genai" and model.device == "CPU"
    assert model.hints == {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    assert model.kv.bytes_per_token == 2 * 2 * 2 * 16 * 4 and model.kv.max_length == 256  # from the IR's states


def test_completions_streamed_and_not_are_llmpipelines_own_greedy_output(served) -> None:
    srv, pkg = served
    want_ids, want = pipeline_greedy(pkg, "Hello, edge", 24)
    doc = {"model": "tiny-ov", "prompt": "Hello, edge", "max_tokens": 24, "temperature": 0}
    whole = json.loads(_post(srv.port, "/v1/completions", doc).read())
    choice = whole["choices"][0]
    assert choice["text"] == want and whole["usage"]["completion_tokens"] == len(want_ids) == 24
    assert whole["usage"]["prompt_tokens"] == len("Hello, edge") and choice["finish_reason"] == "length"
    events = _events(_post(srv.port, "/v1/completions", {**doc, "stream": True}))
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == want
    texts = [e["choices"][0]["text"] for e in events[:-1] if e["choices"][0]["text"]]
    assert 2 <= len(texts) < 24  # the first piece at once, the rest paced (stream_interval_ms, 20 ms by default)
    chat = _events(_post(srv.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                             "max_tokens": 8, "temperature": 0, "stream": True}))  # fmt: skip
    assert chat[0]["choices"][0]["delta"]["role"] == "assistant" and chat[-1] == "[DONE]"
    _, chat_want = pipeline_greedy(pkg, "user: hi\nassistant:", 8)
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in chat[:-1]) == chat_want


def test_a_fast_models_stream_is_paced_by_stream_interval_ms(served, tmp_path) -> None:
    """serving.generative.stream_interval_ms (default 20): a stream goes out in a first piece at once and then a
    piece at most every 20 ms, the text unchanged (the tiny model makes its tokens far faster than that here, so
    fewer pieces than tokens); at 0, a piece whenever the request's thread reads tokens (each a detokenizer call)."""
    srv, pkg = served
    doc = {"model": "tiny-ov", "prompt": "Hello, edge", "max_tokens": 100, "temperature": 0}
    whole = json.loads(_post(srv.port, "/v1/completions", doc).read())
    want, made = whole["choices"][0]["text"], whole["usage"]["completion_tokens"]
    assert made >= 60, whole  # enough tokens for the two to differ

    def pieces(port: int) -> tuple[list[str], float]:
        t0 = time.monotonic()
        events = _events(_post(port, "/v1/completions", {**doc, "stream": True}))
        took = time.monotonic() - t0
        texts = [e["choices"][0]["text"] for e in events[:-1] if e["choices"][0]["text"]]
        assert "".join(texts) == want
        return texts, took

    paced, took = pieces(srv.port)
    assert 2 <= len(paced) <= 2 + took / 0.02, (len(paced), took)
    each_srv, reg = _start(tmp_path, pkg, stream_interval_ms=0)
    try:
        each, _ = pieces(each_srv.port)
    finally:
        assert each_srv.shutdown(10)
        reg.close()
    # at 0 the request's thread sends what came since its last piece as soon as it reads it: as many pieces as it
    # keeps up with (a piece a token on an idle host, fewer on a loaded one), more than the first and the last
    assert len(each) >= 4, (len(each), made)


def test_triton_generate_stream_and_a_stop_string(served) -> None:
    srv, pkg = served
    _, want = pipeline_greedy(pkg, "Hello, edge", 30)  # 30 tokens, no EOS among them
    doc = {"text_input": "Hello, edge", "parameters": {"max_tokens": 30, "temperature": 0}}
    events = _events(_post(srv.port, "/v2/models/tiny-ov/generate_stream", doc))
    assert "".join(e["text_output"] for e in events) == want and events[-1]["finish_reason"] == "length"
    stop = want[6:8]  # a string the greedy text holds: the text ends before its first occurrence
    cut = json.loads(_post(srv.port, "/v2/models/tiny-ov/generate", {**doc, "parameters": {
        **doc["parameters"], "stop": stop}}).read())  # fmt: skip
    assert cut["text_output"] == want[: want.find(stop)] and cut["finish_reason"] == "stop"
    again = {"prompt": "Hello, edge", "max_tokens": 30, "temperature": 0, "stop": [stop], "stream": True}
    streamed = _events(_post(srv.port, "/v1/completions", again))
    assert "".join(e["choices"][0]["text"] for e in streamed[:-1]) == cut["text_output"]
    assert streamed[-2]["choices"][0]["finish_reason"] == "stop"
    # decoded off the generation thread, the stop still ends the generation early: counted from where its text
    # holds the stop string (a piece goes out once it decodes to whole characters), not to max_tokens
    want_ids, _ = pipeline_greedy(pkg, "Hello, edge", 30)
    upto = next(n for n in range(1, 31) if stop in pipeline_decode(pkg, want_ids[:n]))
    counted = json.loads(_post(srv.port, "/v1/completions", {**again, "stream": False}).read())
    assert upto <= counted["usage"]["completion_tokens"] < 30 and counted["choices"][0]["text"] == cut["text_output"]
    sampled = _post(srv.port, "/v1/completions", {"prompt": "abc", "max_tokens": 5, "temperature": 0.8, "top_p": 0.9})
    assert sampled.status == 200
    got = json.loads(sampled.read())
    assert got["usage"]["completion_tokens"] <= 5 and got["choices"][0]["finish_reason"] in ("length", "stop")
    assert _post(srv.port, "/v1/completions", {"prompt": "abc"}, token=None).status == 401


def test_concurrent_streams_take_turns_on_the_pipeline_and_all_finish(served) -> None:
    """LLMPipeline runs one generate at a time (a second at once raises): 4 streams admitted together by the KV
    budget all finish, each with LLMPipeline's greedy text."""
    srv, pkg = served
    _, want = pipeline_greedy(pkg, "Hello, edge", 20)
    texts: list[str] = []

    def one() -> None:
        doc = {"prompt": "Hello, edge", "max_tokens": 20, "temperature": 0, "stream": True}
        texts.append("".join(e["choices"][0]["text"] for e in _events(_post(srv.port, "/v1/completions", doc))[:-1]))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert texts == [want] * 4


def test_a_client_that_hangs_up_mid_stream_ends_its_generation_and_frees_the_budget(tmp_path) -> None:
    """A slower decoder (4 x 256, about 1 ms a token here) with room for 4000 tokens, whose greedy text from "Hello"
    has no EOS in them (LLMPipeline's own): a client that hangs up mid-stream ends the generation, frees its KV
    budget and the pipeline (the next request runs), and is counted as cancelled."""
    import socket

    pkg = write_openvino_package(tmp_path / "slow", variants=(), max_length=4096, layers=4, hidden=256, heads=4)
    eos_free, _ = pipeline_greedy(pkg, "Hello", 4000)
    assert len(eos_free) == 4000  # runs to max_tokens unless stopped
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
        again = _post(srv.port, "/v1/completions", {"prompt": "Hi", "max_tokens": 4, "temperature": 0}, token=None)
        assert again.status == 200 and json.loads(again.read())["usage"]["completion_tokens"] >= 1
    finally:
        assert srv.shutdown(10)
        reg.close()


def push(a: Any, version: str, yaml: str = "", **shape: Any) -> Any:
    """Drop an openvino-genai package into the daemon's inbox (`yaml`: more model.yaml lines); the deployment
    once terminal."""

    def writer(d: Path) -> None:
        write_openvino_package(d, name=NAME, version=version, variants=(), max_length=128, timing=TIMING, **shape)
        with (d / "model.yaml").open("a", encoding="utf-8") as f:
            f.write(yaml)

    drop(a.state_dir, version, name=NAME, writer=writer)

    def ended():
        done = [d for d in a.orchestrator.journal.all() if d.version == version and d.terminal]
        return done[-1] if done else None

    return wait_for(ended, 240, f"deployment of version {version}")


def _generate(a: Any, text: str, tokens: int) -> dict[str, Any]:
    addr = urlsplit(a.url)
    conn = http.client.HTTPConnection(addr.hostname, addr.port, timeout=60)
    body = {"text_input": text, "parameters": {"max_tokens": tokens, "temperature": 0}}
    conn.request("POST", f"/v2/models/{NAME}/generate", json.dumps(body))
    resp = conn.getresponse()
    doc = json.loads(resp.read())
    assert resp.status == 200, doc
    return dict(doc)


def test_an_openvino_genai_package_is_deployed_into_a_running_daemon_and_served(tmp_path) -> None:
    """Mirrors test_generative_swap's first deployment: inbox -> verified -> qualified through LLMPipeline ->
    loaded and swapped in -> probation -> committed; served on the generate routes with LLMPipeline's own greedy
    text (of the row qualification selected); a restart serves it again. Then a v2 with other weights (seed 1) is
    judged in shadow through this engine on the live prompts v1 answered and refused; v1 serves on."""
    a = make_agent(tmp_path, probation_s=1.0, start=True)
    try:
        dep = push(a, "1")
        assert dep.state.value == "committed", dep.reason
        decision = json.loads((a.state_dir / "decisions" / f"{dep.id}.json").read_bytes())
        assert decision["kind"] == "generative" and decision["model"]["runtime"] == "openvino-genai"
        assert decision["selected"].startswith("openvino-genai/CPU:"), decision["selected"]
        selected = dep.data["selected"]
        assert selected["provider"] == "CPU" and Path(selected["model_path"]).is_dir()
        model = a.registry.generative.models[NAME]
        assert model.runtime == "openvino-genai" and model.version == "1"
        got = _generate(a, "Hello, edge", 16)
        assert got["model_version"] == "1" and got["finish_reason"] == "length"
        if selected["precision"] == "fp32":  # device-default compiles with the device's own (bf16) hints
            assert got["text_output"] == pipeline_greedy(Path(selected["model_path"]), "Hello, edge", 16)[1]
        shown = a.status()["models"][NAME]
        assert shown["kind"] == "generative" and shown["version"] == "1" and shown["state"] == "committed", shown
        for text in ("once upon a time", "edge devices measure"):  # live prompts for the next version's shadow
            _generate(a, text, 4)
        other = push(a, "2", seed=1)
        assert other.state.value == "failed", other.reason
        shadow = other.data["shadow"]
        assert shadow["verdict"] == "fail" and shadow["requests"] >= 2 and shadow["agreement"] < 0.98, shadow
        assert _generate(a, "Hello, edge", 4)["model_version"] == "1"  # v1 serves on
    finally:
        a.stop()
    again = make_agent(tmp_path, start=True)  # a restart serves the committed openvino-genai slot
    try:
        assert _generate(again, "Hello, edge", 4)["model_version"] == "1"
        assert again.registry.generative.models[NAME].runtime == "openvino-genai"
    finally:
        again.stop()


class Client:
    """A thread sending generate requests back to back until stopped: the versions that answered, failures."""

    def __init__(self, a: Any) -> None:
        self.a, self.stopped = a, threading.Event()
        self.errors: list[str] = []
        self.versions: set[str] = set()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stopped.is_set():
            n += 1
            try:
                self.versions.add(_generate(self.a, f"request {n}: once upon a time", 24)["model_version"])
            except (AssertionError, OSError) as exc:
                self.errors.append(str(exc))

    def start(self) -> None:
        self.thread.start()
        wait_for(lambda: self.versions, 60, "a first answer")

    def stop(self) -> None:
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join(60)


def test_a_v2_of_the_same_weights_passes_the_shadow_swaps_and_is_paired_on_tpot(tmp_path) -> None:
    """A v2 of v1's weights pushed while a client sends requests: the shadow through this engine agrees (1.0, no
    logit moves at the same precision), it swaps in with 0 failed requests, and its probation runs live prompts
    again on pair copies of both versions for CPU time per token (LLMPipeline's: the difference of two greedy
    runs, ovgenai.paired_tpot); the verdict is the paired machinery's (a rollback, when it is "not judged" here,
    reinstates v1 without a load)."""
    from agent.trial.settings import ProbationConfig

    a = make_agent(tmp_path, probation_s=2.0, probation=ProbationConfig(extend=3.0, paired_share=0.5), start=True)
    client = Client(a)
    try:
        assert push(a, "1").state.value == "committed"
        client.start()
        dep = push(a, "2")
        client.stop()
        assert client.errors == [] and client.versions == {"1", "2"}, (client.errors, client.versions)
        shadow = dep.data["shadow"]
        # each version's own selected row: fp32 or device-default (bf16 here) by its TPOT, so not always bit-equal
        assert shadow["verdict"] == "pass" and shadow["agreement"] >= 0.98 and shadow["requests"] >= 1, shadow
        probation = dep.data["probation"]
        # timed on one inference thread, not the served row's threads: the label says so
        assert probation["measure"] == "TPOT: cpu, one inference thread (pair copies of both versions)", probation
        assert probation["requests"] >= 1, probation
        runs = probation["paired_runs"]  # the mirrored generations ran on both versions, none failed
        assert runs["runs"] >= 2 and runs["failed"] == 0 and runs["offered"] >= 1, runs
        paired = probation["paired"]
        assert set(paired) >= {"ratio", "pairs", "aa", "verdict", "reason"}, paired
        # both versions timed on pair copies (one inference thread: the calling thread's clock; ovgenai.paired_tpot)
        for twin, side in ((runs["twin"], "candidate"), (runs["referee_twin"], "incumbent")):
            assert twin["side"] == side and twin["built"] and twin["error"] is None, runs
        # equal compute is never "slower"; "not slower" commits; too few pairs in the window (a busy host) is
        # "not judged", and serving.unjudged decides (the test's: rollback, to v1 without a load)
        assert paired["verdict"] in ("not slower", "not judged"), paired
        assert dep.state.value == ("committed" if paired["verdict"] == "not slower" else "rolled_back"), dep.reason
        if paired["verdict"] == "not judged":
            assert "too few pairs" in paired["reason"], paired
    finally:
        client.stop()
        a.stop()


@pytest.mark.alone
def test_twice_the_per_token_compute_through_openvino_genai_is_rolled_back_naming_the_paired_tpot_ratio(
    tmp_path,
) -> None:
    """test_generative_swap's slow v2 through this engine: v1 a 3x384 decoder, v2 the same with 3 idle layers
    (zero output projections: the same text, twice the compute a token), pushed while a client sends
    requests. Each version's gates (model.yaml `max_logit_diff` 0.0001) pass only rows that compute in f32, so
    both serve at the same precision on any CPU (the device-default row is bf16 where the CPU has it). The pairs
    run on copies of both versions with one inference thread, timed by the calling thread's clock, so OpenVINO's
    shared thread pool, busy with the live requests, is not in them; v2 is rolled back naming the ratio."""
    from agent.trial.settings import ProbationConfig

    shape = {"layers": 3, "hidden": 384, "heads": 6}  # 1.0 and 2.0 ms a token on one thread here: 1.99x
    strict = "gates: {max_logit_diff: 0.0001}\n"
    a = make_agent(tmp_path, probation_s=2.0, probation=ProbationConfig(extend=10.0, paired_share=0.5), start=True)
    client = Client(a)
    try:
        assert push(a, "1", yaml=strict, **shape).state.value == "committed"
        client.start()
        dep = push(a, "2", yaml=strict, idle=3, **shape)
        client.stop()
        assert client.errors == [] and client.versions >= {"1", "2"}, (client.errors, client.versions)
        assert dep.data["shadow"]["verdict"] == "pass", dep.data["shadow"]
        paired = dep.data["probation"]["paired"]
        assert dep.state.value == "rolled_back" and paired["verdict"] == "slower", (dep.state, paired)
        assert "paired TPOT ratio" in dep.reason and paired["ci"][0] > 1.5, (dep.reason, paired)
        assert _generate(a, "Hello, edge", 4)["model_version"] == "1"  # the referee serves again
    finally:
        client.stop()
        a.stop()
