"""Signed manifests: schema, canonical JSON, Ed25519 sign/verify, and every rejection rule.

A device calls `receive(envelope_bytes, trusted_keys, installed_version)` before downloading a byte; it returns
a verified `Manifest` or raises `ManifestRejected` (a ManifestError) whose `code` and message say why.

`document` holds Manifest and receive, `parts` the artifact, sources and targeting, `envelope` the wire form and
canonical JSON, `policy` the device-side rules, `versions` version order, `rejection` the refusal. Import from here.
"""

from __future__ import annotations

from agent.artifacts.manifest.document import MANIFEST_KEYS, SCHEMA, Manifest, receive
from agent.artifacts.manifest.envelope import MAX_ENVELOPE_BYTES, canonical_json, parse_envelope
from agent.artifacts.manifest.parts import (
    ARTIFACT_KEYS,
    ARTIFACT_OPTIONAL,
    FORMATS,
    MAX_CHUNK,
    MAX_CHUNKS,
    MIN_CHUNK,
    Artifact,
    ArtifactFields,
    Source,
)
from agent.artifacts.manifest.policy import check_policy
from agent.artifacts.manifest.rejection import ManifestRejected, rejection_record
from agent.artifacts.manifest.versions import VERSION_RE, compare_versions, parse_version

__all__ = [
    "ARTIFACT_KEYS",
    "ARTIFACT_OPTIONAL",
    "FORMATS",
    "MANIFEST_KEYS",
    "MAX_CHUNK",
    "MAX_CHUNKS",
    "MAX_ENVELOPE_BYTES",
    "MIN_CHUNK",
    "SCHEMA",
    "VERSION_RE",
    "Artifact",
    "ArtifactFields",
    "Manifest",
    "ManifestRejected",
    "Source",
    "canonical_json",
    "check_policy",
    "compare_versions",
    "parse_envelope",
    "parse_version",
    "receive",
    "rejection_record",
]
