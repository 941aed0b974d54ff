"""Property-based fuzz: arbitrary JSON, mutated envelopes and random chunk payloads never crash the parsers
and nothing is accepted that should not be."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.artifacts import chunks, keys
from agent.artifacts.manifest import Manifest, ManifestRejected, receive
from agent.errors import ArtifactError

NOW = 1_800_000_000
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@pytest.fixture(scope="module")
def signer(tmp_path_factory):
    key_path, pub_path, _ = keys.generate(tmp_path_factory.mktemp("k"))
    priv = keys.load_private_key(key_path)
    good = Manifest.create(
        name="m",
        version="5",
        sha256="c" * 64,
        size=2048,
        chunk_size=1024,
        chunks=["d" * 64] * 2,
        devices=["pi-1"],
        ttl_s=3600,
        now=NOW,
    )
    return priv, keys.trusted_keys([pub_path]), good


@SETTINGS
@given(payload=st.binary(max_size=300))
def test_random_bytes_are_rejected_cleanly(signer, payload):
    with pytest.raises(ManifestRejected):
        receive(payload, signer[1], now=NOW)


@SETTINGS
@given(doc=json_values)
def test_random_json_is_rejected_cleanly(signer, doc):
    with pytest.raises(ManifestRejected):
        receive(json.dumps(doc).encode(), signer[1], now=NOW)


@SETTINGS
@given(manifest=json_values, sig=st.text(max_size=100), kid=st.text(max_size=20))
def test_random_envelopes_are_rejected_cleanly(signer, manifest, sig, kid):
    env = json.dumps({"manifest": manifest, "signature": sig, "key_id": kid}).encode()
    with pytest.raises(ManifestRejected):
        receive(env, signer[1], now=NOW)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@SETTINGS
@given(data=st.data())
def test_mutated_signed_envelope_is_never_accepted_as_something_else(signer, data):
    """Change any one value of a validly signed envelope: either it is rejected, or the result is the
    original manifest (a change that canonicalises to the same bytes)."""
    priv, trusted, good = signer
    env = json.loads(good.sign(priv))
    paths = [p for p in _paths(env) if p]
    path = data.draw(st.sampled_from(paths))
    target = env
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = data.draw(json_values)
    try:
        got = receive(json.dumps(env).encode(), trusted, now=NOW, device_id="pi-1")
    except ManifestRejected:
        return
    assert got == good


@SETTINGS
@given(payload=st.binary(max_size=200))
def test_chunk_wire_parsers_never_crash(payload):
    for decode in (chunks.decode_request, chunks.decode_response):
        try:
            decode(payload)
        except ArtifactError:
            pass
    chunks.peek_sha(payload)


@SETTINGS
@given(
    indices=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=chunks.MAX_INDICES),
    chunk_size=st.integers(1, 2**32 - 1),
    sha=st.binary(min_size=32, max_size=32),
)
def test_chunk_request_roundtrip(indices, chunk_size, sha):
    req = chunks.decode_request(chunks.encode_request(sha.hex(), chunk_size, indices))
    assert (req.sha256, req.chunk_size, list(req.indices)) == (sha.hex(), chunk_size, indices)


@SETTINGS
@given(
    msgs=st.lists(
        st.tuples(
            st.sampled_from(["device", "group:a", "group:b"]),
            st.sampled_from(["m", "n"]),
            st.one_of(
                st.binary(max_size=60),
                json_values.map(lambda v: json.dumps(v).encode()),
                st.sampled_from([b'{"manifest":{"version":"2"}}', b'{"manifest":{"version":"10"}}']),
            ),
        ),
        max_size=30,
    )
)
def test_desired_state_messages_never_crash_and_the_latest_per_scope_comes_out(msgs):
    """Any sequence of retained payloads: events come out, the latest of each (scope, model) as received
    (resolution happens after verification, in lifecycle.desired.DesiredBook)."""
    import queue

    from agent.transport.device import DesiredEvents, RawDesired

    events = DesiredEvents()
    for scope, model, payload in msgs:
        events.raw.put(RawDesired(scope, model, bytes(payload or b""), f"t/{scope}/{model}"))
    last = {}
    while True:
        try:
            ev = events.get(timeout=0)
        except queue.Empty:
            break
        last[(ev.scope, ev.model)] = ev
    final = {}
    for scope, model, payload in msgs:
        final[(scope, model)] = payload
    assert {k: ev.payload for k, ev in last.items()} == {k: bytes(v or b"") for k, v in final.items()}
