"""A real daemon takes a release from the control plane (issue 40, `kind: agent`), end to end: a root-directory
install of release N (`release install`, as install.sh --release lays it out) run by edge-agent-guard standing in
for systemd, serving a committed model, enrolled with a running service (SQLite, in this process) over a real
Mosquitto. Release N+1 (a wheelhouse built from this source by `release build --no-deps`, tests/test_self_update.py)
is uploaded and rolled out with `kind: agent`: the daemon pulls it over the chunked channel, installs it side by
side, asks the guard, which restarts it on N+1, checks READY, the model's golden answer and a stability window,
and keeps it; the service sees the trial's signed report and finishes the rollout. The model serves throughout
(but for the restart's gap) from the same state."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from brokers import Mosquitto
from cp_support import rollout_done, running_service
from support.daemon import drop, write_config
from support.wait import wait_for
from test_self_update import Device, N, wheelhouses  # noqa: F401 - the session fixture: releases built once

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
WAIT_S = 300.0


def _archive(tmp: Path, wheelhouse: Path) -> bytes:
    from agent.release.archive import pack

    return pack(wheelhouse, tmp / f"{wheelhouse.name}.tar.gz").read_bytes()


@pytest.mark.system
def test_a_real_daemon_takes_a_release_from_the_control_plane_and_keeps_it(tmp_path, wheelhouses):  # noqa: F811
    fleet_key = wheelhouses["pub"].parent / "fleet.key"
    with Mosquitto(tmp_path / "mosquitto") as broker:
        doc = {"signing_key": str(fleet_key), "mqtt": {"url": broker.url}, "tick_s": 0.3}
        with running_service(tmp_path / "cp", **doc) as (cp, url):
            api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=60)
            for version in (N, "1.1.0"):
                r = api.put(f"/api/v1/releases/{version}", content=_archive(tmp_path, wheelhouses[version]))
                assert r.status_code == 201, r.text
            grant = api.post("/api/v1/enroll-tokens", json={"name": "dev", "groups": ["lab"], "uses": 1})
            (tmp_path / "enroll.token").write_text(grant.json()["token"] + "\n")
            (tmp_path / "enroll.token").chmod(0o600)
            dev = Device(tmp_path, wheelhouses)
            extra = {
                "trust": {"public_keys": [str(wheelhouses["pub"])]},
                "control_plane": {"url": url, "token_file": str(tmp_path / "enroll.token"), "retry_max_s": 2},
                "groups": ["lab"],
                "inbox": str(dev.state / "inbox"),  # the model arrives by the inbox (with mqtt: only when named)
            }
            dev.conf = write_config(tmp_path / "etc", mqtt={"url": broker.url}, extra=extra)
            # a good release only: limits a loaded host's slow start cannot fail (10 s to READY and 3 s to the
            # broker are test_self_update's, for its faulty releases; beside the CI system lane's other worker
            # this rollout halted once with them)
            dev.start_guard(ready_s=60, broker_s=30)
            try:
                drop(dev.state, "1")
                assert dev.serves("1").endswith(N)

                def on_n():
                    row = api.get("/api/v1/devices/dev-1")
                    return row.json() if row.status_code == 200 and row.json()["agent_version"] == N else None

                before = wait_for(on_n, WAIT_S, f"dev-1 accepted, reporting release {N}", step=1.0)
                assert before["agent_release"]["current"] == N, before
                body = {"kind": "agent", "version": "1.1.0", "deadline_s": 600}
                done = rollout_done(api, body, WAIT_S)
                assert done["state"] == "completed", (done, dev.logs())
                assert [d["result"] for d in done["progress"]["devices"]] == ["succeeded"], done
                rep = dev.report("1.1.0")
                assert rep["result"] == "good" and rep["current"] == "1.1.0" and rep["from"] == N, rep
                assert dev.serves("1").endswith("1.1.0")  # the model, committed under N, serves on N+1
                row = api.get("/api/v1/devices/dev-1").json()
                trial = row["agent_release"]["trial"]
                assert row["agent_version"] == "1.1.0" and row["agent_release"]["previous"] == N, row
                assert trial["result"] == "good" and trial["verified"] is True, row
                assert (dev.root / "releases" / "1.1.0" / "artifact.json").is_file()
            finally:
                dev.stop_guard()
                api.close()
