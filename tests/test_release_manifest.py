"""Release wheelhouses (issue 40): signed by the fleet key, and refused before anything installs when a wheel is
corrupted, missing, unlisted, or the signature is not a trusted key's. A real wheel (pip wheel of a one-module
project, built once per module), real keys, a real venv for the install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.artifacts.keys import generate, load_private_key, trusted_keys
from agent.errors import EdgeAgentError
from agent.release import manifest
from agent.release.install import install, prune, releases
from agent_guard import links


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    """A wheelhouse holding an 'edge-agent' wheel (a stand-in project of one module: cheap to build and install)."""
    base = tmp_path_factory.mktemp("rel")
    src = base / "src"
    (src / "edge_agent_stub").mkdir(parents=True)
    (src / "edge_agent_stub" / "__init__.py").write_text("VALUE = 1\n")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "edge-agent"\nversion = "2.0.0"\n[tool.setuptools]\npackages = ["edge_agent_stub"]\n'
    )
    out = base / "wh"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
        check=True,
    )
    keys = base / "keys"
    generate(keys)
    manifest.make(out, "2.0.0", dependencies="base", key=load_private_key(keys / "fleet.key"))
    return out, trusted_keys([keys / "fleet.pub"])


def _copy(src: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(src, dest)
    return dest


def test_a_signed_wheelhouse_verifies_and_pins_every_hash(wheelhouse):
    wh, trusted = wheelhouse
    doc = manifest.verify(wh, trusted)
    assert doc["version"] == "2.0.0" and len(doc["wheels"]) == 1
    req = manifest.requirements(doc)
    assert req.startswith("edge-agent==2.0.0 --hash=sha256:") and doc["wheels"][0]["sha256"] in req


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda wh: _flip_byte(next(wh.glob("*.whl"))), "digest"),
        (lambda wh: next(wh.glob("*.whl")).unlink(), "missing"),
        (lambda wh: (wh / "extra-1.0-py3-none-any.whl").write_bytes(b"x"), "unlisted"),
        (lambda wh: _edit_manifest(wh, version="9.9.9"), "bad-signature"),
    ],
)
def test_a_damaged_wheelhouse_is_refused_before_install(wheelhouse, tmp_path, damage, reason):
    wh = _copy(wheelhouse[0], tmp_path / "wh")
    damage(wh)
    with pytest.raises(manifest.ReleaseRejected) as err:
        manifest.verify(wh, wheelhouse[1])
    assert err.value.reason == reason, err.value
    with pytest.raises(manifest.ReleaseRejected):
        install(tmp_path / "opt", wh, wheelhouse[1], base_venv=Path(sys.prefix))
    assert not (tmp_path / "opt" / "releases").exists()  # nothing written


def test_another_fleets_key_is_refused(wheelhouse, tmp_path):
    generate(tmp_path / "other")
    with pytest.raises(manifest.ReleaseRejected) as err:
        manifest.verify(wheelhouse[0], trusted_keys([tmp_path / "other" / "fleet.pub"]))
    assert err.value.reason == "untrusted"


def test_install_side_by_side_redoes_an_interrupted_one_and_prunes(wheelhouse, tmp_path):
    wh, trusted = wheelhouse
    root = tmp_path / "opt"
    (root / "releases" / "2.0.0" / "venv").mkdir(parents=True)  # a power cut during an earlier install
    (root / "releases" / "0.9").mkdir()
    done = install(root, wh, trusted, base_venv=Path(sys.prefix))
    assert not done["reused"] and (root / "releases" / "2.0.0" / "installed.json").is_file()
    assert links.target(root, "current") == "2.0.0"  # the first release of a root becomes current
    assert not (root / "releases" / "0.9").exists()  # neither current nor previous: pruned
    py = root / "releases" / "2.0.0" / "venv" / "bin" / "python"
    r = subprocess.run([str(py), "-c", "import edge_agent_stub; print(edge_agent_stub.__file__)"], capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)  # fmt: skip
    assert str(root / "releases" / "2.0.0" / "venv") in r.stdout, r.stderr
    assert install(root, wh, trusted, base_venv=Path(sys.prefix))["reused"]
    assert [r["version"] for r in releases(root)] == ["2.0.0"] and prune(root) == []


def test_a_release_without_dependencies_needs_a_base_venv(wheelhouse, tmp_path):
    with pytest.raises(EdgeAgentError, match="base venv"):
        install(tmp_path / "opt", wheelhouse[0], wheelhouse[1])


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _edit_manifest(wh: Path, **changes) -> None:
    import json

    doc = json.loads((wh / manifest.MANIFEST_NAME).read_text())
    doc.update(changes)
    (wh / manifest.MANIFEST_NAME).write_text(json.dumps(doc))
