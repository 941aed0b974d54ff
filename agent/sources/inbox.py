"""InboxSource: the local-mode DeploymentSource (agent.lifecycle.ports): state_dir/inbox/<model>/<version>/."""

from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import LifecycleError, ModelError
from agent.lifecycle.context import StepContext
from agent.lifecycle.journal import Deployment
from agent.lifecycle.record import Fetched
from agent.names import is_valid_name


class InboxSource:
    """state_dir/inbox/<model>/<version>/ directories (local mode): trusted by filesystem permissions."""

    kind = "inbox"

    def __init__(self, store: Any, staging: Path) -> None:
        self.store, self.staging = store, staging
        self._warned: set[str] = set()

    def ready(self) -> bool:
        return True

    def check(self, dep: Deployment) -> None:
        if not dep.data.get("sha256") and not Path(dep.source["path"]).is_dir():
            raise LifecycleError(f"inbox package {dep.source['path']} disappeared")

    def fetch(self, dep: Deployment, ctx: StepContext) -> Fetched:
        got = fetch_inbox(Path(dep.source["path"]), self.store, self.staging, ctx)
        return Fetched(sha256=got["sha256"], size=got["size"])

    def landed(self, dep: Deployment) -> None:
        """The blob is safe in the store and journaled: the inbox copy goes."""
        shutil.rmtree(dep.source["path"], ignore_errors=True)

    def scan(
        self, inbox: Path, claimed: set[str | None], submit: Callable[..., Any], warn: Callable[[str, str], None]
    ) -> None:
        """Submit every complete inbox/<model>/<version>/ not claimed by an in-flight deployment."""
        for model_dir in sorted(inbox.iterdir()):
            if model_dir.name.startswith(".") or not model_dir.is_dir():
                continue
            for version_dir in sorted(model_dir.iterdir()):
                if version_dir.name.startswith(".") or not version_dir.is_dir() or str(version_dir) in claimed:
                    continue
                if not (is_valid_name(model_dir.name) and is_valid_name(version_dir.name)):
                    if str(version_dir) not in self._warned:
                        self._warned.add(str(version_dir))
                        warn(
                            str(version_dir),
                            "inbox entry ignored: model and version directory names "
                            "must match [A-Za-z0-9][A-Za-z0-9._-]{0,63}",
                        )
                    continue
                submit(model_dir.name, version_dir.name, {"kind": "inbox", "path": str(version_dir)})


def pack_dir(src: Path, dest: Path) -> None:
    """A deterministic .tar.gz of a package directory (sorted names, zeroed times and owners), fsynced."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for path in sorted(p for p in src.rglob("*") if p.is_file() and not p.is_symlink()):
                    rel = path.relative_to(src).as_posix()
                    if any(part.startswith(".") for part in Path(rel).parts):
                        continue
                    info = tarfile.TarInfo(rel)
                    info.size, info.mtime, info.mode = path.stat().st_size, 0, 0o644
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
        raw.flush()
        os.fsync(raw.fileno())


def _generative(src: Path) -> bool:
    """A generative package (docs/generative.md) may hold no .onnx file: OpenVINO GenAI's IR, for one."""
    from agent.generative.package import is_generative

    return is_generative(src)


def fetch_inbox(src: Path, store: Any, staging: Path, ctx: StepContext) -> dict[str, Any]:
    """Local mode 'download': pack the inbox package into the content store."""
    if not src.is_dir():
        raise ModelError(f"inbox package {src} is gone or not a directory")
    if not (src / "model.onnx").is_file() and not list(src.glob("*.onnx")) and not _generative(src):
        raise ModelError(f"inbox package {src} has no model.onnx (nor a model.yaml of kind: generative)")
    ctx.report("pack", path=str(src))
    part = staging / f"inbox-{os.getpid()}-{threading.get_ident()}.tar.gz.part"
    try:
        pack_dir(src, part)
        ctx.check()
        size = part.stat().st_size
        sha = store.put_file(part)
    finally:
        part.unlink(missing_ok=True)
    return {"sha256": sha, "size": size}
