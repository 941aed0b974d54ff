"""Side-by-side installs under a release root (/opt/edge-agent): releases/<version>/venv built offline from a
verified wheelhouse (`pip install --no-index --require-hashes`), never touching the release that runs. It is built
in place (a venv's scripts name their interpreter by absolute path) and complete once installed.json is written,
last and fsynced: an install a power cut left without it is removed and redone. `current`/`previous` are the
guard's (agent_guard.links); `prune` keeps them, a release awaiting or on trial, and nothing else."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from agent.errors import EdgeAgentError
from agent.release import manifest
from agent_guard import links

INSTALLED = "installed.json"
BASE_PTH = "_edge_agent_base.pth"


def releases(root: Path) -> list[dict[str, Any]]:
    """Every complete release under root, with the links and marks that name it."""
    cur, prev = links.target(root, links.CURRENT), links.target(root, links.PREVIOUS)
    out = []
    for path in sorted((root / "releases").glob("*/" + INSTALLED)):
        version = path.parent.name
        out.append(
            {
                "version": version,
                "current": version == cur,
                "previous": version == prev,
                "bad": links.is_bad(root, version),
                "failed_tries": links.tries(root, version),
            }
        )
    return out


def install(root: Path, wheelhouse: Path, trusted: dict[str, Any], *, base_venv: Path | None = None) -> dict[str, Any]:
    """Verify, then build releases/<version>/venv; returns {"version", "path", "reused", "install_s"}."""
    doc = manifest.verify(wheelhouse, trusted)  # nothing is written before the wheelhouse checks out
    version = str(doc["version"])
    dest = root / "releases" / version
    if (dest / INSTALLED).is_file():
        return {"version": version, "path": str(dest), "reused": True, "install_s": 0.0}
    if links.is_bad(root, version):
        raise EdgeAgentError(f"release {version} is marked bad on this device (guard/bad/{version}.json)")
    if doc.get("dependencies") == "base" and base_venv is None:
        raise EdgeAgentError(f"release {version} carries no dependencies: give a base venv")
    started = time.monotonic()
    prune(root, keep_extra=(version,))  # at most current and previous, plus the one being installed
    shutil.rmtree(dest, ignore_errors=True)  # an incomplete install (no installed.json) left by a power cut
    dest.mkdir(parents=True)
    shutil.copytree(wheelhouse, dest / "wheelhouse")
    _venv(dest, doc, base_venv)  # built in place: a venv's scripts name their interpreter by absolute path
    took = round(time.monotonic() - started, 3)
    links.write_json(dest / INSTALLED, {"version": version, "installed": time.time(), "install_s": took})
    if links.target(root, links.CURRENT) is None:  # the first release of a root: nothing runs yet to trial it
        links.set_link(root, links.CURRENT, version)
    return {"version": version, "path": str(dest), "reused": False, "install_s": took}


def _venv(dest: Path, doc: dict[str, Any], base_venv: Path | None) -> None:
    venv = dest / "venv"
    # a release with its dependencies gets pip from ensurepip (offline): the next release installs with
    # `python -m pip` of this one; a release over a base venv finds the base's pip through its .pth line
    with_pip = doc.get("dependencies") != "base"
    _run([sys.executable, "-m", "venv", *(() if with_pip else ("--without-pip",)), str(venv)], "create the venv")
    (dest / "requirements.txt").write_text(manifest.requirements(doc))
    cmd = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-index"]
    cmd += ["--require-hashes", "--no-cache-dir", "--find-links", str(dest / "wheelhouse")]
    cmd += ["-r", str(dest / "requirements.txt")]
    if doc.get("dependencies") == "base":
        cmd.append("--no-deps")
    else:
        base_venv = None  # a release with its dependencies uses nothing of another venv
    _run(cmd, "install the wheelhouse")
    if base_venv is not None:  # a release without dependencies: the base venv's packages, after its own
        (_site_packages(venv) / BASE_PTH).write_text("".join(f"{p}\n" for p in base_paths(base_venv)))


def base_paths(base_venv: Path) -> list[str]:
    """The base venv's site-packages, and its own base's when it is itself such a release (a .pth line is not
    a site directory: the .pth files in it are not read)."""
    site = _site_packages(base_venv.resolve())
    try:
        inherited = [line for line in (site / BASE_PTH).read_text().splitlines() if line]
    except OSError:
        inherited = []
    return [str(site), *inherited]


def _site_packages(venv: Path) -> Path:
    py = f"python{sysconfig.get_python_version()}"
    return venv / "lib" / py / "site-packages"


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env())
    if done.returncode != 0:
        raise EdgeAgentError(f"cannot {what} ({done.returncode}): {done.stderr.strip()[-1500:]}")


def _clean_env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    return {**env, "PIP_CONFIG_FILE": os.devnull}  # no site-wide index, find-links or constraints: the wheelhouse only


def awaiting(root: Path) -> list[str]:
    """The releases the guard is asked to trial or is trialling now: never pruned."""
    docs = (links.read_json(root / "guard" / name) for name in ("request.json", "trial.json"))
    return [d["version"] for d in docs if d and isinstance(d.get("version"), str)]


def prune(root: Path, keep_extra: tuple[str, ...] = ()) -> list[str]:
    """Remove every release that is neither current, previous, awaiting its trial (guard/request.json), on
    trial (guard/trial.json) nor in keep_extra (and partial installs)."""
    keep = {links.target(root, links.CURRENT), links.target(root, links.PREVIOUS), *keep_extra, *awaiting(root)}
    removed = []
    for path in sorted((root / "releases").iterdir()) if (root / "releases").is_dir() else []:
        if path.name not in keep:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed
