"""A flood of 10,000 hostile desired-state messages in about 10 s (forged, unsigned, untrusted, future-dated,
garbage; on the device's topics and its group's, for 500 model names): a legitimate push made after it commits
within 30 s, and journals, status.json and the whole state_dir stay small."""

from __future__ import annotations

import json
import os
import time

from support.agent import make_agent
from support.mqtt import ControlPlane, mqtt_config, wait_for

from agent.artifacts.manifest import Manifest
from agent.samples import sample_tiny_package

FLOOD = int(os.environ.get("EDGE_AGENT_TEST_FLOOD", "10000"))
KINDS = ("forged", "unsigned", "untrusted", "future", "garbage")


def _size(root) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_flood_then_a_legitimate_push_commits_within_30s(tmp_path, mosquitto):
    cp = ControlPlane(tmp_path / "cp", mosquitto)
    cp.serve()
    cfg, _ = mqtt_config(tmp_path / "dev", mosquitto, cp, groups=("lab",))
    events: list[dict] = []
    a = make_agent(None, config=cfg, serve_http=False, known_providers=["cpu"], on_event=events.append, start=True)
    try:
        assert a.link.link.wait_connected(30)
        pkg = sample_tiny_package(tmp_path / "pkg", version="1")
        base = cp.manifest(pkg, "tiny", "1")
        payloads = []
        for i in range(FLOOD):
            kind, model = KINDS[i % len(KINDS)], ("tiny" if i % 7 == 0 else f"m{i % 500}")
            d = base.to_dict()
            d.update(name=model, version=str(2 + i))
            if kind == "future":
                d.update(issued_at=int(time.time()) + 30 * 86400, expires_at=int(time.time()) + 60 * 86400)
            m = Manifest.from_dict(d)
            payload = b"{not json" if kind == "garbage" else cp.envelope(m, how="signed" if kind == "future" else kind)
            topic = cp.topics.group_desired("lab", model) if i % 3 == 0 else cp.topics.device_desired("dev-1", model)
            payloads.append((topic, payload))
        started = time.monotonic()
        for n, (topic, payload) in enumerate(payloads):
            cp.link.publish(topic, payload, qos=0, retain=True)
            if n % 1000 == 999:
                time.sleep(max(0.0, (n + 1) / 1000 - (time.monotonic() - started)))  # about 1,000 a second
        flood_s = time.monotonic() - started

        pushed = time.monotonic()
        cp.to_device("tiny", cp.envelope(cp.manifest(pkg, "tiny", "1")))
        wait_for(
            lambda: any(d.version == "1" and d.state.value == "committed" for d in a.orchestrator.journal.all()),
            30,
            "the legitimate push to commit within 30 s of the flood",
        )
        commit_s = time.monotonic() - pushed
        a.write_status()
        records = list((a.state_dir / "deployments").glob("*.json"))
        status_bytes = (a.state_dir / "status.json").stat().st_size
        total = _size(a.state_dir)
        doc = json.loads((a.state_dir / "status.json").read_bytes())
        print(
            f"\nflood {FLOOD} msgs in {flood_s:.1f} s; legit push committed {commit_s:.1f} s later; "
            f"journal {len(records)} files; status.json {status_bytes} B; state_dir {total} B; "
            f"rejected models in status {len(doc.get('rejected') or {})}; "
            f"rejections reported {sum(e.get('event') == 'rejected' for e in events)}"
        )
        assert len(records) == 1
        assert status_bytes < 64 * 1024
        assert total < 2 * 1024 * 1024
        assert a.registry.models() == {"tiny": "1"}
    finally:
        a.stop()
        cp.close()
