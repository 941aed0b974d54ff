"""Ed25519 fleet keys: generate, load (PEM or raw base64), key ids, trusted-key sets."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

from agent.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

# cryptography is imported inside the functions: importing this module stays cheap (tests/test_import_light.py)

PRIVATE_NAME = "fleet.key"
PUBLIC_NAME = "fleet.pub"


def raw_public_bytes(public_key: Ed25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives import serialization as s

    return public_key.public_bytes(s.Encoding.Raw, s.PublicFormat.Raw)


def key_id(public_key: Ed25519PublicKey) -> str:
    """The first 16 hex digits of sha256 over the raw 32-byte public key."""
    return hashlib.sha256(raw_public_bytes(public_key)).hexdigest()[:16]


def generate(out_dir: str | os.PathLike[str], overwrite: bool = False) -> tuple[Path, Path, str]:
    """Write DIR/fleet.key (PKCS8 PEM, mode 0600) and DIR/fleet.pub (PEM); return (key, pub, key_id)."""
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric import ed25519

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = out / PRIVATE_NAME, out / PUBLIC_NAME
    if not overwrite and (key_path.exists() or pub_path.exists()):
        raise ConfigError(f"{key_path} or {pub_path} already exists; refusing to overwrite a fleet key")
    priv = ed25519.Ed25519PrivateKey.generate()
    pem = priv.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())
    pub_pem = priv.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(key_path, 0o600)
    pub_path.write_bytes(pub_pem)
    return key_path, pub_path, key_id(priv.public_key())


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Load an Ed25519 private key (PKCS8 PEM); ConfigError with the path on any problem."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read signing key {path}: {exc.strerror or exc}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ConfigError(f"{path} is not an Ed25519 key")
    return key


def parse_public_key(text: str | bytes, where: str = "public key") -> Ed25519PublicKey:
    """Accept a PEM SubjectPublicKeyInfo or the base64 of the raw 32 bytes."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    data = text.encode() if isinstance(text, str) else bytes(text)
    try:
        if b"-----BEGIN" in data:
            key = serialization.load_pem_public_key(data)
        else:
            raw = base64.b64decode(data.strip(), validate=True)
            key = ed25519.Ed25519PublicKey.from_public_bytes(raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where} is not an Ed25519 public key (PEM or base64 of 32 bytes): {exc}") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ConfigError(f"{where} is not an Ed25519 public key")
    return key


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read public key {path}: {exc.strerror or exc}") from None
    return parse_public_key(data, where=str(path))


def trusted_keys(
    keys: Iterable[str | os.PathLike[str] | bytes | Ed25519PublicKey] | None,
) -> dict[str, Ed25519PublicKey]:
    """Build {key_id: public key} from paths, PEM/base64 strings or key objects."""
    out: dict[str, Ed25519PublicKey] = {}
    for k in keys or ():
        if isinstance(k, os.PathLike) or (
            isinstance(k, str) and not k.lstrip().startswith("-----") and Path(k).exists()
        ):
            pub = load_public_key(k)  # a path (a missing one is a ConfigError naming it)
        elif isinstance(k, (str, bytes)):
            pub = parse_public_key(k)
        else:
            pub = k
        out[key_id(pub)] = pub
    return out


DEVICE_KEY_NAME, DEVICE_PUB_NAME = "device.key", "device.pub"


@overload
def device_key(state_dir: str | os.PathLike[str], create: Literal[True] = True) -> Ed25519PrivateKey: ...
@overload
def device_key(state_dir: str | os.PathLike[str], create: bool) -> Ed25519PrivateKey | None: ...
def device_key(state_dir: str | os.PathLike[str], create: bool = True) -> Ed25519PrivateKey | None:
    """The device's own Ed25519 key (state_dir/device.key, 0600; device.pub beside it), made on first use
    (`edge-agent keys device` at install). It signs the device's status and events; its public key is
    registered with the control plane (`edge-agent fleet register`). None when absent and create=False."""
    from cryptography.hazmat.primitives.asymmetric import ed25519

    root = Path(state_dir)
    path = root / DEVICE_KEY_NAME
    if path.exists():
        return load_private_key(path)
    if not create:
        return None
    from cryptography.hazmat.primitives import serialization as s

    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    priv = ed25519.Ed25519PrivateKey.generate()
    pem = priv.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())
    tmp = root / f".{DEVICE_KEY_NAME}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)  # never replaces a key another process made meanwhile
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    key = load_private_key(path)
    pub = key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo)
    (root / DEVICE_PUB_NAME).write_bytes(pub)
    os.chmod(root / DEVICE_PUB_NAME, 0o600)
    return key


def public_pem(public_key: Ed25519PublicKey) -> str:
    from cryptography.hazmat.primitives import serialization as s

    return public_key.public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo).decode()
