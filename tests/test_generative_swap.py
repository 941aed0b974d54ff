"""Swap and probation of a generative model in a daemon (issue 39; docs/generative.md, "Swap and probation"): a
DeviceAgent in-process (the daemon's own code: inbox, verification, qualification, activation, probation,
rollback) with real onnxruntime-genai over real HTTP. A generative package dropped into the inbox is qualified,
deployed and served; a v2 pushed while 4 streaming clients run loads beside v1 and swaps between requests, every
stream finishing on the version it started on, none failing; its probation is judged on paired TPOT against v1
(live prompts run again on both, back to back, with A/A pairs): a v2 with twice the per-token compute (the decoder
made in code with as many idle layers again: zero output projections, the same text, so it passes the shadow) is
rolled back naming the paired TPOT ratio, one of equal compute commits. The paired block is in the journal, the
decision record and the status. Before the swap the shadow judges v2 on the live prompts: one with other weights is
refused there, 0 streams failing."""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from support.agent import make_agent
from support.daemon import drop
from support.wait import wait_for

from agent.generative.samples import write_generative_package
from agent.lifecycle.status_doc import figures_brief
from agent.trial.settings import ProbationConfig

pytest.importorskip("onnxruntime_genai")

NAME = "lm"
SHAPE = {"layers": 3, "hidden": 192, "heads": 4}  # about 0.15 ms a token here: compute, not call overhead
TIMING = {"prompt_lengths": [16, 32], "tpot_tokens": 16, "repeats": 2, "greedy_tokens": 16}  # a short qualification
KEYS = {"ratio", "ci", "pairs", "aa", "conditions", "verdict", "reason"}
LINE = 1.5  # serving.probation.ratio, the default (the daemon fixture says why it is set)


def push(a: Any, version: str, **shape: Any) -> Any:
    """Drop a generative package into the inbox; the deployment once terminal."""
    drop(a.state_dir, version, name=NAME,
         writer=lambda d: write_generative_package(d, name=NAME, version=version, variants=(), max_length=128,
                                                   timing=TIMING, **{**SHAPE, **shape}))  # fmt: skip

    def ended():
        done = [d for d in a.orchestrator.journal.all() if d.version == version and d.terminal]
        return done[-1] if done else None

    return wait_for(ended, 240, f"deployment of version {version}")


class Streams:
    """`clients` threads streaming /v2/models/lm/generate_stream one after another until stopped; per stream the
    versions its events named, its finish_reason and when it started and ended; failures as text."""

    def __init__(self, url: str, clients: int = 4, tokens: int = 48) -> None:
        self.addr = urlsplit(url)
        self.tokens = tokens
        self.done: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> Streams:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def _client(self, i: int) -> None:
        conn = http.client.HTTPConnection(self.addr.hostname, self.addr.port, timeout=30)
        n = 0
        while not self._stop.is_set():
            n += 1
            body = {
                "text_input": f"client {i} asks, time {n}: once upon a time",
                "parameters": {"max_tokens": self.tokens},
            }
            start = time.monotonic()
            try:
                conn.request("POST", f"/v2/models/{NAME}/generate_stream", json.dumps(body))
                resp = conn.getresponse()
                text = resp.read().decode()
            except OSError as exc:
                self.errors.append(f"client {i}: {exc}")
                conn.close()
                conn = http.client.HTTPConnection(self.addr.hostname, self.addr.port, timeout=30)
                continue
            if resp.status != 200:
                self.errors.append(f"client {i}: {resp.status} {text[:200]}")
                continue
            events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
            finish = events[-1].get("finish_reason") if events else None
            if finish not in ("length", "stop"):
                self.errors.append(f"client {i}: a stream ended without finish_reason: {text[-200:]}")
            versions = {e["model_version"] for e in events}
            self.done.append({"versions": versions, "start": start, "end": time.monotonic(), "finish": finish})

    def wait(self, count: int) -> None:
        wait_for(lambda: len(self.done) >= count, 60, f"{count} streams")


@pytest.fixture
def daemon(tmp_path):
    """A daemon serving version 1, committed (probation 2 s, watched on up to 30 windows while the pairs are not
    judged: a CI run of 6 December 2026 had 9 pairs after 10; paired_share 0.5: enough pairs within that on a shared host, the default is 0.1; the line LINE is the
    default 1.5x, set here so the assertions read it: with the serving side timed on a twin, this decoder's
    twice-the-compute v2 read 1.80-1.87x, [1.66, 2.00] at the widest, on this project's Xeon quiet and beside two
    busy loops; on the serving version itself it read 1.65x, [1.48, 1.72] once, and equal compute 0.87x)."""
    probation = ProbationConfig(extend=30.0, paired_share=0.5, ratio=LINE)
    a = make_agent(tmp_path, probation_s=2.0, probation=probation, start=True)
    try:
        dep = push(a, "1")
        assert dep.state.value == "committed", dep.reason
        yield a, dep
    finally:
        a.stop()


def _swap(a: Any, **shape: Any) -> tuple[Any, Streams]:
    with Streams(a.url) as streams:
        streams.wait(8)
        dep = push(a, "2", **shape)
        after = len(streams.done)
        streams.wait(after + 8)
    assert streams.errors == []  # 0 failed streams, through the swap and (when it came) the rollback
    for s in streams.done:  # every stream finished on the version it started on
        assert len(s["versions"]) == 1, s
    # ... and one was in flight at the swap: v1 answered it, and it ended after the first stream v2 answered began
    first_v2 = min(s["start"] for s in streams.done if s["versions"] == {"2"})
    across = [s for s in streams.done if s["versions"] == {"1"} and s["start"] < first_v2 < s["end"]]
    assert across, "no stream was in flight across the swap"
    return dep, streams


def _paired(a: Any, dep: Any) -> dict[str, Any]:
    paired = dep.data["probation"]["paired"]
    assert set(paired) == KEYS, paired
    assert paired["pairs"] >= 16, (paired["reason"], dep.data["probation"]["paired_runs"])
    twin = dep.data["probation"]["paired_runs"]["twin"]  # v2, serving, timed on a copy its clients never ran
    assert twin["side"] == "candidate" and twin["built"] and twin["error"] is None, twin
    decision = json.loads((a.state_dir / "decisions" / f"{dep.id}.json").read_bytes())
    assert decision["kind"] == "generative" and decision["probation"]["paired"]["verdict"] == paired["verdict"]
    shown = a.status()["deployments"][NAME]
    assert shown["probation"]["paired"]["verdict"] == paired["verdict"]
    assert "paired x" in figures_brief(shown) and "A/A" in figures_brief(shown)
    return paired


def _served_version(a: Any) -> str:
    addr = urlsplit(a.url)
    conn = http.client.HTTPConnection(addr.hostname, addr.port, timeout=30)
    conn.request(
        "POST", f"/v2/models/{NAME}/generate", json.dumps({"text_input": "hi", "parameters": {"max_tokens": 2}})
    )
    resp = conn.getresponse()
    doc = json.loads(resp.read())
    assert resp.status == 200, doc
    return str(doc["model_version"])


def test_an_inbox_generative_package_is_qualified_deployed_and_served(daemon):
    a, dep = daemon
    decision = json.loads((a.state_dir / "decisions" / f"{dep.id}.json").read_bytes())
    row = next(r for r in decision["results"] if r["key"] == decision["selected"])
    assert decision["kind"] == "generative" and row["status"] == "passed" and row["tpot_ms"]["p50_ms"] > 0
    assert dep.data["selected"]["provider"] == "cpu" and Path(dep.data["selected"]["model_path"]).is_dir()
    assert _served_version(a) == "1"
    shown = a.status()["models"][NAME]
    assert shown["kind"] == "generative" and shown["version"] == "1" and shown["state"] == "committed", shown
    assert "paired" not in dep.data["probation"]  # a first deployment: no incumbent to pair against
    a.stop()
    again = make_agent(a.state_dir.parent, start=True)  # a restart serves the committed generative slot
    try:
        assert _served_version(again) == "1"
    finally:
        again.stop()


@pytest.mark.alone
def test_equal_compute_v2_swaps_under_4_streams_and_commits(daemon):
    a, _ = daemon
    dep, streams = _swap(a)
    assert dep.state.value == "committed", dep.reason
    shadow = dep.data["shadow"]  # judged on the streams' prompts before the swap: the same weights agree
    assert shadow["verdict"] == "pass" and shadow["requests"] >= 1 and shadow["agreement"] == 1.0, shadow
    assert shadow["max_logit_diff"] == 0.0 and shadow["against"] == "1", shadow
    paired = _paired(a, dep)
    assert paired["verdict"] == "not slower" and "paired TPOT ratio" in paired["reason"], paired
    assert _served_version(a) == "2"
    assert a.registry.generative.models[NAME].observers == []  # the pairs stopped observing v2's generations
    back = a.orchestrator.rollback(NAME)  # the operator's rollback loads the previous slot
    assert back.state.value == "committed" and _served_version(a) == "1", (back.state, back.reason)


@pytest.mark.alone
def test_twice_the_per_token_compute_is_rolled_back_naming_the_paired_tpot_ratio(daemon):
    a, _ = daemon
    dep, streams = _swap(a, idle=SHAPE["layers"])  # the same logits: it passes the shadow, then probation
    paired = _paired(a, dep)
    assert dep.state.value == "rolled_back", (dep.state, dep.reason)
    assert paired["verdict"] == "slower" and "paired TPOT ratio" in dep.reason, dep.reason
    assert paired["ci"][0] > LINE and paired["ci"][0] > paired["aa"]["ci"][1], paired
    assert _served_version(a) == "1"  # the referee serves again, without a load


def test_a_v2_that_disagrees_on_live_prompts_is_refused_in_shadow_with_0_failed_streams(daemon):
    """v2 with other weights (seed 1) passes its own qualification (its variants are judged against its own fp32)
    but its teacher-forced logits on the live prompts disagree with v1's: the shadow refuses the swap before any
    client sees it; v1 serves on."""
    a, _ = daemon
    with Streams(a.url) as streams:
        streams.wait(8)
        dep = push(a, "2", seed=1)
        after = len(streams.done)
        streams.wait(after + 4)
    assert streams.errors == [] and all(s["versions"] == {"1"} for s in streams.done), streams.errors
    assert dep.state.value == "failed" and "shadow: teacher-forced top-1 agreement" in dep.reason, dep.reason
    decision = json.loads((a.state_dir / "decisions" / f"{dep.id}.json").read_bytes())
    row = next(r for r in decision["results"] if r["key"] == decision["selected"])
    assert row["fidelity"]["top1"] == 1.0  # qualification passed it: the shadow is what refused it
    shadow = dep.data["shadow"]
    assert shadow["verdict"] == "fail" and shadow["requests"] >= 1 and shadow["agreement"] < 0.98, shadow
    assert f"agreement {shadow['agreement']:.4g} under the floor 0.98" in dep.reason, dep.reason
    assert decision["shadow"]["agreement"] == shadow["agreement"]
    assert a.status()["deployments"][NAME]["shadow"]["verdict"] == "fail"
    assert _served_version(a) == "1"


def test_with_no_live_prompts_the_shadow_is_not_judged_and_the_deployment_goes_on(daemon):
    a, _ = daemon
    dep = push(a, "2")
    shadow = dep.data["shadow"]
    assert shadow["verdict"] == "not judged" and shadow["reason"] == "shadow: not judged: no live prompts", shadow
    assert shadow["agreement"] is None and shadow["requests"] == 0
    assert dep.state.value == "committed", dep.reason  # a quiet probation window passes (min_requests 0)
    assert _served_version(a) == "2"


def test_the_host_swaps_reinstates_and_removes_between_requests(tmp_path):
    """GenerativeHost alone: a generation that began on v1 ends on v1 after the swap; the referee comes back only
    as its own version; the name's metrics go on across versions; remove() stops serving the name."""
    from agent.serving.generative.engine import Sampling, Usage
    from agent.serving.generative.host import GenerativeHost

    host = GenerativeHost()
    dirs = [write_generative_package(tmp_path / v, name=NAME, version=v, variants=()) for v in ("1", "2")]
    host.swap(NAME, host.load(NAME, "1", dirs[0], "cpu"))
    v1 = host.models[NAME]
    prompt = v1.encode("once upon a time")
    sampling = Sampling(max_tokens=8, temperature=0)
    pieces = v1.generate(prompt, sampling, Usage(), v1.reserve(prompt, sampling))
    next(pieces)  # in flight on v1
    assert host.swap(NAME, host.load(NAME, "2", dirs[1], "cpu"), keep_previous=True) is v1
    assert host.version(NAME) == "2" and host.referee(NAME) is v1 and host.models[NAME].stats is v1.stats
    "".join(pieces)  # the generation in flight ends on the version it began on
    assert v1.stats.counts["requests_total"] == 1 and host.budget.held == 0
    assert not host.reinstate(NAME, "3") and host.version(NAME) == "2"
    assert host.reinstate(NAME, "1") and host.models[NAME] is v1 and host.referee(NAME) is None
    host.remove(NAME)
    assert NAME not in host.models


def test_the_shadow_judges_on_live_prompts_and_never_waits_for_the_kv_budget(tmp_path):
    """genshadow alone: the same weights agree (1.0, no logit moves), other weights fall under the floor; when the
    client streams hold the whole KV budget no prompt is judged and none waits: "not judged" with the count."""
    from agent.serving.generative.host import GenerativeHost
    from agent.trial import genshadow

    host = GenerativeHost()
    host.configure(1 << 20, max_streams=2)
    dirs = {v: write_generative_package(tmp_path / v, name=NAME, version=v, variants=(), seed=int(v == "3"))
            for v in ("1", "2", "3")}  # fmt: skip
    v1 = host.load(NAME, "1", dirs["1"], "cpu")
    host.swap(NAME, v1)
    floor = {"min_top1": 0.98, "max_logit_diff": 1.0}
    for text in ("once upon a time", "edge devices measure"):
        v1.recent.add(v1.encode(text))
    same = genshadow.judge(v1, host.load(NAME, "2", dirs["2"], "cpu"), floor)
    assert same["verdict"] == "pass" and same["agreement"] == 1.0 and same["max_logit_diff"] == 0.0, same
    assert same["requests"] == 2 and same["positions"] == 2 * genshadow.TEACHER_TOKENS, same
    other = genshadow.judge(v1, host.load(NAME, "3", dirs["3"], "cpu"), floor)
    assert other["verdict"] == "fail" and other["agreement"] < 0.98, other
    assert other["reason"].startswith(f"shadow: teacher-forced top-1 agreement {other['agreement']:.4g} under"), other
    held = [host.budget.lease(1, "a client stream") for _ in range(2)]  # max_streams: no room for a shadow run
    busy = genshadow.judge(v1, host.load(NAME, "2", dirs["2"], "cpu"), floor)
    for lease in held:
        lease.release()
    assert busy["verdict"] == "not judged" and busy["busy"] == 2, busy
    assert busy["reason"] == "shadow: not judged: all 2 live prompts found the KV budget held by clients"
