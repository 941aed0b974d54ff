"""Registering is load-change-save under a lock: eight processes registering at once all land in registry.json."""

from __future__ import annotations

import multiprocessing
import os

from agent.artifacts.keys import device_key, public_pem
from agent.fleet.registry import REGISTRY_NAME, DeviceRegistry


def _register(store: str, device_id: str, pem: str, go) -> None:
    go.wait()
    with DeviceRegistry.edit(os.path.join(store, REGISTRY_NAME)) as reg:
        reg.register(device_id, pem, ["lab"])


def test_concurrent_registrations_all_land(tmp_path):
    store = tmp_path / "cp-store"
    pems = {f"dev-{n}": public_pem(device_key(tmp_path / f"state-{n}").public_key()) for n in range(8)}
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    procs = [ctx.Process(target=_register, args=(str(store), d, pem, go)) for d, pem in pems.items()]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    reg = DeviceRegistry.load(store / REGISTRY_NAME)
    assert sorted(reg.devices) == sorted(pems)
    assert reg.members("lab") == sorted(pems)
    assert oct((store / REGISTRY_NAME).stat().st_mode & 0o777) == "0o600"


def test_a_failed_edit_saves_nothing(tmp_path):
    path = tmp_path / REGISTRY_NAME
    pem = public_pem(device_key(tmp_path / "s").public_key())
    with DeviceRegistry.edit(path) as reg:
        reg.register("dev-1", pem, [])
    try:
        with DeviceRegistry.edit(path) as reg:
            reg.register("dev-2", public_pem(device_key(tmp_path / "t").public_key()), [])
            raise RuntimeError("operator aborted")
    except RuntimeError:
        pass
    assert sorted(DeviceRegistry.load(path).devices) == ["dev-1"]
