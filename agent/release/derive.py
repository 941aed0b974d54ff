"""A release derived from a built one by a small patch, without pip: the edge-agent wheel rewritten under a new
version (its dist-info renamed, METADATA's Version and RECORD's hashes redone) with some of its files replaced,
and the wheelhouse's manifest signed again. The self-update tests and the fault campaign
(bench/self_update_faults.py) make each faulty release this way in milliseconds from one `release build`."""

from __future__ import annotations

import base64
import hashlib
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

from agent.errors import EdgeAgentError
from agent.release import manifest

Patch = Callable[[str, bytes], bytes]  # (path in the wheel, content) -> new content


def replace_text(path: str, old: str, new: str) -> Patch:
    """A patch replacing the first `old` in one file by `new` (`old` empty: appends `new`)."""

    def patch(name: str, data: bytes) -> bytes:
        if name != path:
            return data
        text = data.decode()
        if old and old not in text:
            raise EdgeAgentError(f"{path}: the text to replace is not there: {old[:80]!r}")
        return (text.replace(old, new, 1) if old else text + new).encode()

    return patch


def derive(src: Path, out: Path, version: str, key, patches: tuple[Patch, ...] = ()) -> Path:
    """Wheelhouse OUT (replaced): SRC's wheels, its edge-agent wheel as `version` with `patches` applied; signed."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    agent = None
    for whl in sorted(src.glob("*.whl")):
        if manifest.wheel_name(whl.name)[0] == "edge-agent":
            agent = whl
        else:
            shutil.copy2(whl, out / whl.name)
    if agent is None:
        raise EdgeAgentError(f"{src} holds no edge-agent wheel")
    _rewrite(agent, out, version, patches)
    manifest.make(out, version, dependencies=_dependencies(src), key=key)
    return out


def _dependencies(src: Path) -> str:
    from agent.util.atomic import read_json

    return str((read_json(src / manifest.MANIFEST_NAME) or {}).get("dependencies") or "wheelhouse")


def _rewrite(whl: Path, out: Path, version: str, patches: tuple[Patch, ...]) -> Path:
    old = manifest.wheel_name(whl.name)[1]
    stem = whl.name.split("-", 1)[0]  # edge_agent
    old_info, new_info = f"{stem}-{old}.dist-info/", f"{stem}-{version}.dist-info/"
    dest = out / whl.name.replace(f"{stem}-{old}-", f"{stem}-{version}-", 1)
    record: list[str] = []
    changed = [False] * len(patches)
    with zipfile.ZipFile(whl) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            name = info.filename.replace(old_info, new_info, 1)
            if name == new_info + "RECORD":
                continue
            data = zin.read(info)
            if name == new_info + "METADATA":
                data = data.replace(f"\nVersion: {old}\n".encode(), f"\nVersion: {version}\n".encode(), 1)
            for i, patch in enumerate(patches):
                before, data = data, patch(name, data)
                changed[i] = changed[i] or data != before
            zout.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        record.append(f"{new_info}RECORD,,")
        zout.writestr(new_info + "RECORD", "\n".join(record) + "\n")
    if not all(changed):
        raise EdgeAgentError(f"{whl.name}: a patch changed nothing (no such file in the wheel?)")
    return dest
