"""The device registry the control plane writes (STORE/registry.json): each device's public key and groups.

`fleet push --wait`, `fleet rollout` and `fleet status` verify every device report against it and take group
membership from it, never from the device's own claim. An unsigned, unregistered or badly signed report is
marked as such (`trust`) and its claims (models, deployments) are set aside: it never counts as success.
Without a registry nothing can be verified: `fleet status` still lists the reports (trust
"unverified (no device registry)", claims set aside), while push --wait, rollout and rollback --wait refuse to run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from agent.errors import ConfigError
from agent.transport.topics import check_name
from agent.util.atomic import atomic_write_json, read_json

REGISTRY_NAME = "registry.json"
FORMAT = 1
CLAIMS = ("models", "deployments", "rejected", "recent_deployments")  # what an unverified report may not assert
NO_REGISTRY = "unverified (no device registry)"
KEY_OF_ANOTHER = "key-of-another-device"
REMEDY = (
    "on each device run `edge-agent keys device --config agent.yaml`, then register its public key here: "
    "`edge-agent fleet register DEVICE --public-key device.pub --group G --store {store}`"
)


def set_aside(doc: dict[str, Any], trust: str, groups: list[str] | None = None) -> dict[str, Any]:
    """An unverified report as the control plane shows it: `trust` set, groups only from the registry (none
    without one; the device's own claim kept as `claimed_groups`), its claims moved under `unverified_claims`."""
    out = dict(doc, trust=trust, groups=list(groups or []))
    out["unverified_claims"] = {k: out.pop(k) for k in CLAIMS if k in out}
    out["claimed_groups"] = doc.get("groups")
    return out


class DeviceRegistry:
    """{device_id: {"public_key": PEM, "key_id", "groups": [...]}}; loaded once, verified keys cached."""

    def __init__(self, devices: dict[str, dict[str, Any]] | None = None, path: Path | None = None):
        self.devices = dict(devices or {})
        self.path = path
        self._keys: dict[str, Any] = {}
        self._holders: dict[str, set[str]] | None = None  # key id -> devices, built when first asked
        self._indexed = 0  # how many devices the index holds (a dict changed behind put's back is indexed again)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "DeviceRegistry":
        path = Path(path)
        try:
            doc = read_json(path, default=None)
        except ValueError as exc:
            raise ConfigError(f"{path}: unreadable device registry: {exc}") from None
        if doc is None:
            return cls({}, path)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("devices"), dict):
            raise ConfigError(f"{path}: not a device registry this version understands")
        return cls(doc["devices"], path)

    @classmethod
    @contextlib.contextmanager
    def edit(cls, path: str | os.PathLike[str]) -> Iterator["DeviceRegistry"]:
        """Load, change, save under an exclusive lock (PATH.lock): two operators (or a simulator and an
        operator) registering at once both land. Saved only when the block ends without an exception."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            registry = cls.load(path)
            yield registry
            registry.save(path)
        finally:
            os.close(fd)  # releases the lock

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        target = Path(path or self.path or REGISTRY_NAME)
        atomic_write_json(target, {"format": FORMAT, "devices": self.devices}, mode=0o600)
        return target

    def register(
        self, device_id: str, public_key_pem: str, groups: Iterable[str] = (), *, replace: bool = False
    ) -> dict[str, Any]:
        """One key, one device: a key another device holds is refused (ConfigError naming it) unless `replace`,
        which moves it here and revokes the other device's binding (the entry leaves the registry; its id is
        returned under `revoked`)."""
        from agent.artifacts.keys import key_id, parse_public_key

        check_name(device_id, "device id", ConfigError)
        for g in groups:
            check_name(g, "group", ConfigError)
        pub = parse_public_key(public_key_pem, where=f"public key of {device_id}")
        kid = key_id(pub)
        holders = self.holders(kid, other_than=device_id)
        if holders and not replace:
            raise ConfigError(
                f"key {kid} is already registered to device {', '.join(holders)}: one key signs for one device; "
                f"give {device_id} its own key (`edge-agent keys device` on it), or pass --replace to move the key "
                f"to {device_id} and revoke {', '.join(holders)}'s binding"
            )
        for other in holders:
            self.unregister(other)
        entry = {"public_key": public_key_pem.strip() + "\n", "key_id": kid, "groups": sorted(set(groups))}
        self.put(device_id, entry)
        return dict(entry, revoked=holders)

    def put(self, device_id: str, entry: dict[str, Any] | None) -> None:
        """Set (None: drop) one device's entry; its cached key and the key index follow (nothing else reloads)."""
        old = self.devices.pop(device_id, None)
        self._keys.pop(device_id, None)
        if self._holders is not None and old is not None:
            self._holders.get(str(old.get("key_id")), set()).discard(device_id)
        if entry is not None:
            self.devices[device_id] = entry
            if self._holders is not None:
                self._holders.setdefault(str(entry.get("key_id")), set()).add(device_id)
        self._indexed = len(self.devices)

    def holders(self, kid: str, other_than: str | None = None) -> list[str]:
        """Devices registered with key id `kid` (but `other_than`), from an index (a lookup, not a scan)."""
        if self._holders is None or self._indexed != len(self.devices):
            self._indexed, self._holders = len(self.devices), {}
            for d, e in self.devices.items():
                self._holders.setdefault(str(e.get("key_id")), set()).add(d)
        return sorted(d for d in self._holders.get(kid, ()) if d != other_than)

    def unregister(self, device_id: str, key_id: str | None = None) -> bool:
        """Drop a device (only while it still has `key_id`, when given); True when it was removed."""
        entry = self.devices.get(device_id)
        if entry is None or (key_id is not None and entry.get("key_id") != key_id):
            return False
        self.put(device_id, None)
        return True

    def check_waitable(
        self, command: str, devices: Iterable[str], groups: Iterable[str], store: str | os.PathLike[str]
    ) -> None:
        """Waiting is for devices whose reports can count: every targeted device registered, every group with a
        registered member (membership comes only from the registry). ConfigError with the remedy otherwise."""
        missing = [d for d in devices if d not in self.devices]
        empty = [g for g in groups if not self.members(g)]
        if missing or empty:
            what = [f"device {d} is not in the device registry {self.path}" for d in missing]
            what += [f"no device of group {g} is in the device registry {self.path}" for g in empty]
            raise ConfigError(
                f"{command}: {'; '.join(what)}: its reports would never count; " + REMEDY.format(store=store)
            )

    def groups(self, device_id: str) -> list[str]:
        return list((self.devices.get(device_id) or {}).get("groups") or [])

    def members(self, group: str) -> list[str]:
        return sorted(d for d, e in self.devices.items() if group in (e.get("groups") or []))

    def trust(self, device_id: str, doc: dict[str, Any]) -> str:
        """verified | unregistered | unsigned | bad-signature | key-of-another-device (the signer's key is
        registered to another device id too: a registry written before keys were unique; never counted)."""
        from agent.artifacts.keys import parse_public_key
        from agent.transport.signing import SIG, verify_doc

        entry = self.devices.get(device_id)
        if not entry:
            return "unregistered"
        sig = doc.get(SIG)
        signer = sig.get("key_id") if isinstance(sig, dict) else None
        if signer and self.holders(str(signer), other_than=device_id):
            return KEY_OF_ANOTHER
        if device_id not in self._keys:
            self._keys[device_id] = parse_public_key(entry["public_key"], where=f"registry key of {device_id}")
        return verify_doc(doc, self._keys[device_id])

    def apply(self, device_id: str, doc: dict[str, Any]) -> dict[str, Any]:
        """The document as the control plane may believe it: `trust` set, groups from the registry, and the
        claims of an unverified report moved under `unverified_claims`."""
        trust = self.trust(device_id, doc)
        if trust != "verified":
            return set_aside(doc, trust, self.groups(device_id))
        return dict(doc, trust=trust, groups=self.groups(device_id))


def registry_for_store(store: str | os.PathLike[str] | None) -> DeviceRegistry | None:
    """STORE/registry.json when it exists (None: no registry; reports are shown as unverified)."""
    if store is None:
        return None
    path = Path(store) / REGISTRY_NAME
    return DeviceRegistry.load(path) if path.exists() else None


def require_registry(store: str | os.PathLike[str] | None, command: str) -> DeviceRegistry:
    """STORE/registry.json, or a ConfigError naming the remedy: `command` decides on device reports, and without
    a registry none of them can be verified (so none could ever count)."""
    registry = registry_for_store(store)
    if registry is None:
        where = Path(store) / REGISTRY_NAME if store is not None else REGISTRY_NAME
        raise ConfigError(
            f"{command}: no device registry ({where}): device reports cannot be verified, so none would count; "
            + REMEDY.format(store=store if store is not None else "STORE")
        )
    return registry
