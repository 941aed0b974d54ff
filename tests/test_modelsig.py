"""OpenSSF model signatures (model-signing library and its CLI) on packages, on the device: signed packages
verify offline with a trusted key or certificate chain; a file changed after signing is refused by name and the
previous version keeps serving."""

import datetime
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from support.daemon import Daemon, drop, infer, write_config

from agent.artifacts.modelsig import SIGNATURE_NAME, ModelTrust, sign_package, verify_package
from agent.errors import ModelError
from agent.samples import sample_tiny_package

CLI = Path(sys.executable).parent / "model_signing"


def ec_keys(directory: Path, name: str = "signer") -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    directory.mkdir(parents=True, exist_ok=True)
    priv, pub = directory / f"{name}.key", directory / f"{name}.pub"
    priv.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return priv, pub


def cli_sign(package: Path, private_key: Path) -> None:
    """Sign with the `model_signing` command (as a publisher would, elsewhere)."""
    out = subprocess.run(
        [
            str(CLI),
            "sign",
            "key",
            "--private_key",
            str(private_key),
            "--signature",
            str(package / SIGNATURE_NAME),
            str(package),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


def test_cli_signed_package_verifies_and_a_changed_file_is_named(tmp_path):
    priv, pub = ec_keys(tmp_path / "keys")
    pkg = sample_tiny_package(tmp_path / "pkg")
    cli_sign(pkg, priv)
    got = verify_package(pkg, ModelTrust((pub,)))
    assert got["verified"] and got["manifest_sha256"] and "model.onnx" in got["files"]

    _, other = ec_keys(tmp_path / "keys", "other")
    with pytest.raises(ModelError, match="does not verify with any trusted key"):
        verify_package(pkg, ModelTrust((other,)))
    victim = next(p for p in sorted(pkg.rglob("*")) if p.is_file() and p.name != SIGNATURE_NAME)
    victim.write_bytes(victim.read_bytes() + b" ")
    with pytest.raises(ModelError, match=f"changed after signing: {victim.relative_to(pkg).as_posix()}"):
        verify_package(pkg, ModelTrust((pub,)))


def test_certificate_signed_package_verifies_against_its_ca(tmp_path):
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test model CA")])

    def certificate(subject: x509.Name, key: ec.EllipticCurvePrivateKey, serial: int, ca: bool):
        """A certificate issued by the CA for key, valid from yesterday for 30 days; the caller adds usages."""
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )

    ca = (
        certificate(ca_name, ca_key, 1, ca=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        certificate(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "publisher")]), leaf_key, 2, ca=False)
        .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    d = tmp_path / "pki"
    d.mkdir()
    (d / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "leaf.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    (d / "leaf.key").write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    pkg = sample_tiny_package(tmp_path / "pkg")
    sign_package(pkg, d / "leaf.key", certificate=d / "leaf.pem", chain=(d / "ca.pem",))
    assert verify_package(pkg, ModelTrust(certificate_chains=(d / "ca.pem",)))["signer"] == "certificate chain ca.pem"


def test_daemon_refuses_a_tampered_package_and_keeps_serving(tmp_path):
    priv, pub = ec_keys(tmp_path / "keys")

    def signed(version, tamper=False, sign=True):
        def write(d):
            sample_tiny_package(d, version=version)
            if sign:
                cli_sign(d, priv)
            if tamper:  # a different, valid model under the signed name: only the signature can tell
                import onnx

                from agent.samples import tiny_model

                onnx.save(tiny_model(9.0), d / "model.onnx")

        return write

    cfg = write_config(tmp_path / "dev", extra={"trust": {"model_signing_keys": [str(pub)]}})
    state = tmp_path / "dev" / "state"
    d = Daemon(cfg, state)
    try:
        d.wait_ready()
        drop(state, "1", writer=signed("1"))
        assert d.wait_deployment("1")["result"] == "committed", d.tail()
        assert infer(d.url) == ("1", [1.0] * 4)
        # the qualification evidence names the model signature's manifest digest as well as the artifact's
        from agent.artifacts.keys import device_key
        from agent.evidence.verify import verify_attestation

        att = next((state / "attestations").glob("*tiny-1-*.qualification.intoto.json"))
        digest = verify_attestation(att.read_bytes(), device_key(state).public_key())["digest"]
        assert set(digest) == {"sha256", "model-signing-manifest-sha256"}

        drop(state, "2", writer=signed("2", tamper=True))
        dep = d.wait_deployment("2")
        assert dep["result"] == "failed" and "changed after signing: model.onnx" in dep["reason"], dep
        assert infer(d.url) == ("1", [1.0] * 4)

        drop(state, "3", writer=signed("3", sign=False))
        dep = d.wait_deployment("3")
        assert dep["result"] == "failed" and "no model.sig" in dep["reason"], dep
        assert infer(d.url) == ("1", [1.0] * 4)
    finally:
        assert d.terminate() == 0, d.tail()


def _add_git_files(package: Path) -> None:
    """What the attack adds after signing: files model-signing leaves out of its manifest by default."""
    (package / ".gitattributes").write_text("*.onnx filter=lfs diff=lfs merge=lfs -text\n")
    (package / ".git").mkdir()
    (package / ".git" / "config").write_text('[core]\n\tfsmonitor = "touch /tmp/pwned"\n')


def test_files_the_signature_does_not_cover_are_refused_by_name(tmp_path):
    priv, pub = ec_keys(tmp_path / "keys")
    pkg = sample_tiny_package(tmp_path / "pkg")
    cli_sign(pkg, priv)  # the CLI writes .git/, .gitattributes, ... as ignore_paths into the signed manifest
    _add_git_files(pkg)
    with pytest.raises(ModelError, match=r"not covered by the signature: \.git/config, \.gitattributes"):
        verify_package(pkg, ModelTrust((pub,)))

    # signed by this module (no ignore list in the manifest): the library itself sees the extra files
    own = sample_tiny_package(tmp_path / "own")
    sign_package(own, priv)
    (own / "extra.py").write_text("import os\n")
    with pytest.raises(ModelError, match=r"not covered by the signature: extra\.py"):
        verify_package(own, ModelTrust((pub,)))

    # the device's explicit ignore list: accepted, and the result names what was left unsigned
    got = verify_package(pkg, ModelTrust((pub,), ignore_paths=(".git", ".gitattributes")))
    assert got["ignored"] == [".git/config", ".gitattributes"] and ".gitattributes" not in got["files"]
    with pytest.raises(ModelError, match=r"not covered by the signature: \.gitattributes"):
        verify_package(pkg, ModelTrust((pub,), ignore_paths=(".git",)))


def test_ignore_paths_config_is_checked(tmp_path):
    from agent.config.sections import read_trust
    from agent.config.validator import Validator
    from agent.errors import ConfigError

    v = Validator(tmp_path)
    got = read_trust(v, {"model_signing_ignore_paths": [".git/", "docs/README.md"]})
    assert got.model_signing_ignore_paths == (".git", "docs/README.md")
    for bad in ("../x", "/etc", ".", "model.sig", 3):
        with pytest.raises(ConfigError, match="model_signing_ignore_paths"):
            read_trust(v, {"model_signing_ignore_paths": [bad]})


def test_daemon_refuses_unsigned_git_files_unless_its_config_names_them(tmp_path, mosquitto):
    """Over MQTT (a pushed directory keeps its dot files; the local inbox drops them): a device requiring model
    signatures refuses the package with .git/ files added after signing, and the previous version keeps serving;
    a device whose config names those paths deploys it and its journal lists the files left unsigned."""
    import json

    from support.mqtt import ControlPlane

    priv, pub = ec_keys(tmp_path / "keys")
    cp = ControlPlane(tmp_path / "cp", mosquitto)
    cp.serve()

    def push(version, git_files):
        pkg = sample_tiny_package(tmp_path / f"pkg-{version}", version=version)
        cli_sign(pkg, priv)
        if git_files:
            _add_git_files(pkg)
        cp.to_device("tiny", cp.envelope(cp.manifest(pkg, "tiny", version)))

    def daemon(name, ignore=None):
        trust = {"public_keys": [str(cp.pubfile)], "model_signing_keys": [str(pub)]}
        if ignore:
            trust["model_signing_ignore_paths"] = ignore
        cfg = write_config(tmp_path / name, mqtt={"url": mosquitto.url}, extra={"trust": trust})
        return Daemon(cfg, tmp_path / name / "state"), tmp_path / name / "state"

    d, _ = daemon("strict")
    try:
        d.wait_ready()
        push("1", git_files=False)
        assert d.wait_deployment("1")["result"] == "committed", d.tail()
        push("2", git_files=True)
        dep = d.wait_deployment("2")
        assert dep["result"] == "failed", dep
        assert "not covered by the signature: .git/config, .gitattributes" in dep["reason"], dep
        assert infer(d.url) == ("1", [1.0] * 4)
    finally:
        assert d.terminate() == 0, d.tail()

    d, state = daemon("lenient", ignore=[".git", ".gitattributes"])
    try:
        d.wait_ready()
        assert d.wait_deployment("2")["result"] == "committed", d.tail()
        assert infer(d.url)[0] == "2"
        journal = [json.loads(p.read_bytes()) for p in (state / "deployments").glob("*.json")]
        sig = next(j["data"]["model_signature"] for j in journal if j["version"] == "2")
        assert sig["ignored"] == [".git/config", ".gitattributes"] and "model.onnx" in sig["files"]
        assert "unsigned files left in by trust.model_signing_ignore_paths" in d.tail()
    finally:
        assert d.terminate() == 0, d.tail()
        cp.close()
