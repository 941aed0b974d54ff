"""OpenSSF Model Signing on packages (the `model-signing` library, 1.x): a detached signature, `model.sig` at the
package root, over a manifest of every file's digest (a Sigstore bundle wrapping an in-toto statement).

A device with trusted model-signing keys or certificate chains (config `trust.model_signing_keys`,
`trust.model_signing_certificates`) accepts a package only when its signature verifies with one of them: in
addition to the signed envelope (targeting, versions, expiry), never instead of it. Verification is offline
(keys and certificate chains only: no Sigstore, no OIDC, no network). A file changed, added or removed after
signing is refused by name, and so is any file the signature does not cover: the library's own ignore list
(`.git/`, `.gitattributes`, `.github/`, `.gitignore`) and the paths a signer lists as ignored in the signed
manifest are not honoured. Only paths the device's config names (`trust.model_signing_ignore_paths`) are left
out, and the result says which files were (the deployment's journal records it).
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from agent.errors import ModelError

SIGNATURE_NAME = "model.sig"  # the `model_signing` CLI's default name


@dataclass(frozen=True)
class ModelTrust:
    public_keys: tuple[Path, ...] = ()  # PEM public keys (EC P-256/P-384/P-521: what model-signing signs with)
    certificate_chains: tuple[Path, ...] = ()  # PEM CA certificates that signing certificates must chain to
    ignore_paths: tuple[str, ...] = ()  # package-relative files or folders left unsigned on purpose (config)

    @property
    def enabled(self) -> bool:
        return bool(self.public_keys or self.certificate_chains)


def sign_package(
    package_dir: str | os.PathLike[str],
    private_key: str | os.PathLike[str],
    *,
    certificate: str | os.PathLike[str] | None = None,
    chain: tuple[str | os.PathLike[str], ...] = (),
) -> Path:
    """Write package_dir/model.sig: signed with a key, or with a key and its certificate (+ chain)."""
    signing = _library("signing")

    root = Path(package_dir)
    cfg = signing.Config()
    if certificate is None:
        cfg.use_elliptic_key_signer(private_key=private_key)
    else:
        cfg.use_certificate_signer(private_key=private_key, signing_certificate=certificate, certificate_chain=chain)
    cfg.set_hashing_config(_hashing(()))
    cfg.sign(root, root / SIGNATURE_NAME)
    return root / SIGNATURE_NAME


def _library(what: str) -> ModuleType:
    """The model_signing module `what`, or a ModelError saying how to install it (edge-agent[signing])."""
    import importlib

    try:
        return importlib.import_module(f"model_signing.{what}")
    except ImportError as exc:
        raise ModelError(
            f"model signature: the model-signing library is not installed ({exc.name}): "
            "pip install 'edge-agent[signing]' on a device whose trust names model-signing keys or certificates"
        ) from None


def verify_package(package_dir: str | os.PathLike[str], trust: ModelTrust) -> dict[str, Any]:
    """{"verified": True, "signer", "manifest_sha256", "files"} or ModelError naming what failed (the file)."""
    verifying = _library("verifying")

    root = Path(package_dir)
    sig = root / SIGNATURE_NAME
    if not sig.is_file():
        raise ModelError(
            f"model signature: the package has no {SIGNATURE_NAME}; this device accepts only packages signed "
            "with a trusted model-signing key or certificate"
        )
    failures: list[str] = []
    signers = [("key", p) for p in trust.public_keys] + [("certificate chain", p) for p in trust.certificate_chains]
    for kind, path in signers:
        cfg = verifying.Config()
        if kind == "key":
            cfg.use_elliptic_key_verifier(public_key=path)
        else:
            cfg.use_certificate_verifier(certificate_chain=[path])
        cfg.set_hashing_config(_hashing(trust.ignore_paths))
        try:
            cfg.verify(root, sig)
        except Exception as exc:  # noqa: BLE001 - the library raises ValueError and others; each is a refusal
            failures.append(f"{kind} {path.name}: {exc}")
            continue
        files, ignored = _coverage(root, signed_files(sig), trust.ignore_paths)
        return {
            "verified": True,
            "signer": f"{kind} {path.name}",
            "manifest_sha256": manifest_digest(sig),
            "files": files,
            "ignored": ignored,
        }
    raise ModelError(_explain(failures))


def _package_files(root: Path) -> list[str]:
    """Every entry under root but model.sig, package-relative (links and other non-folders included)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        # a link to a folder is listed as an entry, never followed
        entries = filenames + [d for d in dirnames if (here / d).is_symlink()]
        out += [(here / n).relative_to(root).as_posix() for n in entries]
    return sorted(p for p in out if p != SIGNATURE_NAME)


def _ignored(name: str, ignore_paths: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p.rstrip("/") + "/") for p in ignore_paths)


def _coverage(root: Path, signed: set[str], ignore_paths: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(covered files, files left out by the device's ignore_paths), or ModelError naming every file in the package
    that the signature does not cover (whatever ignore list the signer wrote into the signed manifest)."""
    files, ignored, unsigned = [], [], []
    for name in _package_files(root):
        if name in signed:
            files.append(name)
        elif _ignored(name, ignore_paths):
            ignored.append(name)
        else:
            unsigned.append(name)
    if unsigned:
        raise ModelError(
            f"model signature: file(s) not covered by the signature: {', '.join(unsigned[:20])}"
            f"{' ...' if len(unsigned) > 20 else ''} (the package is refused; trust.model_signing_ignore_paths "
            "names paths a device may leave unsigned)"
        )
    return files, ignored


def signed_files(signature: str | os.PathLike[str]) -> set[str]:
    """The file names the signature's manifest lists (shards `name:start:end` count as their file)."""
    try:
        bundle = json.loads(Path(signature).read_bytes())
        pred = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))["predicate"]
        shards = pred["serialization"].get("method") == "shards"
        names = {str(r["name"]) for r in pred["resources"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelError(f"model signature: {SIGNATURE_NAME} lists no readable file manifest ({exc})") from None
    return {n.rsplit(":", 2)[0] for n in names} if shards else names


def manifest_digest(signature: str | os.PathLike[str]) -> str | None:
    """The sha256 the signature's in-toto statement names as its subject (the digest of the file manifest)."""
    try:
        bundle = json.loads(Path(signature).read_bytes())
        stmt = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        return str(stmt["subject"][0]["digest"]["sha256"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def _hashing(ignore_paths: tuple[str, ...]) -> Any:  # model_signing.hashing.Config (an optional library)
    """Files hashed: all but model.sig and the device's explicit ignore_paths (no git-path defaults)."""
    hashing = _library("hashing")
    return hashing.Config().set_ignored_paths(paths=[SIGNATURE_NAME, *ignore_paths], ignore_git_paths=False)


def _explain(failures: list[str]) -> str:
    """The clearest reason: files that changed after signing (by name) beat a signature by an unknown key."""
    changed = sorted({m for f in failures for m in re.findall(r"[Hh]ash mismatch for \\?['\"]([^'\"\\]+)", f)})
    if changed:
        return f"model signature: file(s) changed after signing: {', '.join(changed)} (the package is refused)"
    unsigned = sorted(
        {
            n.strip()
            for f in failures
            for m in re.findall(r"Extra files found in model [^:]*: ([^'\"\]]+)", f)
            for n in m.split(",")
        }
    )
    if unsigned:
        return f"model signature: file(s) not covered by the signature: {', '.join(unsigned)} (the package is refused)"
    extra = [f for f in failures if re.search(r"(?i)extra|missing|not found|unsigned", f)]
    if extra:
        return f"model signature: the package's files differ from the signed ones: {extra[0][:300]}"
    if not failures:
        return "model signature: no trusted model-signing key or certificate is configured"
    return "model signature does not verify with any trusted key: " + "; ".join(f[:200] for f in failures)
