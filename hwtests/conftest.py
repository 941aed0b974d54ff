"""Device context for the hardware suite: profile, target, features, provider variants, isolated workers.

Tests marked `@pytest.mark.feature("tensorrt", ...)` run only where the matched target (plus what the
profile confirms) has every named feature; provider variants that are unavailable here skip with the
probe's reason. Options: --provider NAME (repeatable), --target NAME, --node-case GLOB (repeatable),
--models-dir DIR, --budget SECONDS.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("edge-agent hardware suite")
    group.addoption(
        "--provider", action="append", default=[], help="provider to test (repeatable); default: all available"
    )
    group.addoption("--target", default=None, help="target name instead of the matched one")
    group.addoption("--node-case", action="append", default=[], help="only node cases matching this glob (repeatable)")
    group.addoption("--models-dir", default=None, help="also qualify every package in this directory")
    group.addoption("--budget", type=float, default=1.0, help="seconds of timed runs per model and provider")


def pytest_configure(config):
    config.addinivalue_line("markers", "feature(*names): run only where the target has every named feature")


class Device:
    """What this device is, computed once per session."""

    def __init__(self, config):
        from agent.conformance.runner import variants_for
        from agent.hardware import detect
        from agent.targets import features_for, get_target, match

        self.profile = detect("/")
        name = config.getoption("--target")
        self.target = get_target(name) if name else match(self.profile)
        self.features = features_for(self.profile, self.target)
        self.variants, self.left_out = variants_for(config.getoption("--provider") or None, self.profile, self.target)


def device(config) -> Device:
    if not hasattr(config, "_edge_device"):
        config._edge_device = Device(config)
    return config._edge_device


def pytest_generate_tests(metafunc):
    config = metafunc.config
    if "variant" in metafunc.fixturenames:
        variants = device(config).variants
        metafunc.parametrize("variant", variants, ids=[v.key for v in variants], scope="session")
    if "node_case" in metafunc.fixturenames:
        from agent.conformance.node import load_cases

        cases = load_cases(config.getoption("--node-case") or None)
        metafunc.parametrize("node_case", cases, ids=[c.name for c in cases])
    if "model_package" in metafunc.fixturenames:
        paths = _model_packages(config)
        metafunc.parametrize("model_package", paths, ids=[p.name for p in paths])


def _model_packages(config) -> list[Path]:
    import tempfile

    from agent.conformance import models

    work = Path(tempfile.mkdtemp(prefix="edge-agent-hwtests-"))
    paths = models.light_packages(work / "light") + models.sample_packages(work / "samples")
    if config.getoption("--models-dir"):
        paths += models.user_packages(Path(config.getoption("--models-dir")))
    return paths


def pytest_collection_modifyitems(config, items):
    features = device(config).features
    target = device(config).target.name
    for item in items:
        for mark in item.iter_markers("feature"):
            missing = [f for f in mark.args if f not in features]
            if missing:
                item.add_marker(pytest.mark.skip(reason=f"target {target} lacks feature(s): {', '.join(missing)}"))


@pytest.fixture(scope="session")
def dev(request) -> Device:
    return device(request.config)


@pytest.fixture(scope="session")
def workers():
    """One isolated worker per provider variant (a crash restarts it; the suite goes on)."""
    from agent.isolate.runner import IsolatedWorker

    pool: dict[str, IsolatedWorker] = {}

    def get(key: str) -> IsolatedWorker:
        if key not in pool:
            pool[key] = IsolatedWorker()
        return pool[key]

    yield get
    for w in pool.values():
        w.close()


@pytest.fixture
def budget(request) -> float:
    return request.config.getoption("--budget")
