"""Lifecycle actions on real files: reproducible inbox packing, verification of .tar.gz and bare .onnx blobs."""

from __future__ import annotations

import pytest

from agent.artifacts.store import ContentStore
from agent.errors import LifecycleError, ModelError
from agent.lifecycle.context import Cancelled, DeadlineExceeded, StepContext
from agent.lifecycle.stages.verify import verify
from agent.samples import sample_tiny_package, tiny_model
from agent.sources.inbox import fetch_inbox


def test_packing_is_reproducible_and_verifies(tmp_path):
    store = ContentStore(tmp_path / "state")
    pkg = sample_tiny_package(tmp_path / "pkg", version="3")
    ctx = StepContext(None)
    a = fetch_inbox(pkg, store, tmp_path / "tmp", ctx)
    (pkg / "model.onnx").touch()  # a new mtime must not change the artifact
    b = fetch_inbox(pkg, store, tmp_path / "tmp", ctx)
    assert a == b and store.list() == [a["sha256"]]
    got = verify(store, a["sha256"], tmp_path / "state" / "packages", ctx)
    assert got["model_path"].endswith("model.onnx") and len(got["model_sha256"]) == 64


def test_bare_onnx_blob_and_tampering(tmp_path):
    import onnx

    store = ContentStore(tmp_path / "state")
    onnx.save(tiny_model(2.0), str(tmp_path / "m.onnx"))
    sha = store.put_file(tmp_path / "m.onnx")
    got = verify(store, sha, tmp_path / "state" / "packages", StepContext(None))
    assert got["model_sha256"] == sha  # a bare model: the artifact is the model
    store.path(sha).chmod(0o644)
    store.path(sha).write_bytes(b"tampered")
    with pytest.raises(LifecycleError, match="hash mismatch"):
        verify(store, sha, tmp_path / "state" / "packages", StepContext(None))


def test_fetch_refuses_a_directory_without_a_model(tmp_path):
    (tmp_path / "pkg").mkdir()
    with pytest.raises(ModelError, match="no model.onnx"):
        fetch_inbox(tmp_path / "pkg", ContentStore(tmp_path / "s"), tmp_path / "tmp", StepContext(None))


def test_step_context_cancel_and_deadline():
    import time

    ctx = StepContext(time.monotonic() + 3600)
    ctx.check()
    ctx.cancel_event, ctx.cancel_reason = "supersede", "superseded by version 9"
    ctx.cancel.set()
    with pytest.raises(Cancelled, match="version 9") as err:
        ctx.check()
    assert err.value.event == "supersede"
    with pytest.raises(DeadlineExceeded):
        StepContext(time.monotonic() - 1).check()
