"""kill -9 of the daemon in the middle of a delta pull: the restart asks for no chunk already verified on disk,
fetches only the changed tensor, and commits the new version."""

from __future__ import annotations

import hashlib
import signal
import time

from delta_models import versions
from support.daemon import Daemon, write_config
from support.mqtt import ControlPlane
from support.wait import wait_for
from test_daemon_mqtt_crash import Requests

from agent.artifacts.recipe import Layout
from agent.artifacts.store import ContentStore
from agent.fleet.artifact_server import ArtifactServer
from agent.transport.mqtt import BrokerConfig


class SlowServer(ArtifactServer):
    """A real artifact server that takes 0.15 s per chunk (a slow uplink), so the kill lands mid-pull."""

    def _answer(self, req, index):
        time.sleep(0.15)
        return super()._answer(req, index)


def _recipe(cp: ControlPlane, path):
    from agent.fleet.push import store_package

    return store_package(path, cp.store_dir, validate=False)["recipe"]


def _on_disk(state_dir, layout: Layout) -> set[int]:
    part = state_dir / "staging" / f"{layout.sha256}.part"
    if not part.exists():
        return set()
    data = part.read_bytes()
    return {
        i
        for i in range(layout.count)
        if hashlib.sha256(data[layout.offset(i) : layout.offset(i) + layout.lens[i]]).hexdigest() == layout.chunks[i]
    }


def test_sigkill_mid_delta_pull_resumes_and_commits(mosquitto, tmp_path):
    v1, v2, changed = versions(tmp_path, layers=4, width=1024)  # one 4 MB tensor of 16 MB: 16 chunks
    cp = ControlPlane(tmp_path / "cp", mosquitto)
    server = SlowServer(ContentStore(cp.store_dir), BrokerConfig(mosquitto.url)).start()
    cfg = write_config(
        tmp_path / "dev", mqtt={"url": mosquitto.url}, extra={"trust": {"public_keys": [str(cp.pubfile)]}}
    )
    state = tmp_path / "dev" / "state"
    sniff = Requests(mosquitto)
    try:
        d = Daemon(cfg, state)
        try:
            cp.to_device("mlp", cp.envelope(cp.manifest(v1, "mlp", "1", recipe=_recipe(cp, v1))))
            assert wait_for(lambda: ((d.status() or {}).get("models") or {}).get("mlp"), 240, "v1", d.proc)
        finally:
            assert d.terminate() == 0, d.tail()
        m2 = cp.manifest(v2, "mlp", "2", recipe=_recipe(cp, v2))
        a = m2.artifact
        layout = Layout.from_recipe(a.sha256, a.size, dict(a.recipe))
        sniff.take()
        cp.to_device("mlp", cp.envelope(m2))
        d = Daemon(cfg, state)
        held = layout.count - 16  # chunks v1 already has
        wait_for(lambda: len(_on_disk(state, layout)) >= held + 5, 240, "a part of the delta", d.proc)
        d.proc.send_signal(signal.SIGKILL)
        assert d.proc.wait(60) == -9
        have = _on_disk(state, layout)
        assert held + 5 <= len(have) < layout.count
        sniff.take()
        d = Daemon(cfg, state)
        try:
            dep = wait_for(
                lambda: (
                    (((d.status() or {}).get("deployments") or {}).get("mlp") or {}).get("result")
                    and d.status()["deployments"]["mlp"]
                ),
                240,
                "v2 result",
                d.proc,
            )
            assert dep["version"] == "2" and dep["result"] == "committed", d.tail()
            again = set(sniff.take()) & have
            assert not again, f"the restart asked again for chunks already verified on disk: {sorted(again)}"
            assert dep["bytes_fetched"] <= 1.1 * changed and dep["bytes_reused"] == a.size - dep["bytes_fetched"], dep
        finally:
            assert d.terminate() == 0, d.tail()
    finally:
        sniff.link.stop()
        server.stop()
        cp.close()
