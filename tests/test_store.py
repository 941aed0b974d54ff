"""ContentStore and Staging: content addressing, atomic commits, bitmap persistence and recovery."""

import hashlib
import os

import pytest

from agent.artifacts.manifest import Manifest
from agent.artifacts.staging import Staging
from agent.artifacts.store import ContentStore, hash_file
from agent.errors import ArtifactError

CHUNK = 4096


def artifact_of(data: bytes):
    chunks = [hashlib.sha256(data[i : i + CHUNK]).hexdigest() for i in range(0, len(data), CHUNK)]
    return Manifest.create(
        name="m",
        version="1",
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        chunk_size=CHUNK,
        chunks=chunks,
        devices=["d"],
    ).artifact


def test_put_file_is_content_addressed(tmp_path):
    store = ContentStore(tmp_path / "s")
    src = tmp_path / "x.bin"
    src.write_bytes(b"hello" * 1000)
    sha = store.put_file(src)
    assert sha == hashlib.sha256(src.read_bytes()).hexdigest()
    assert store.has(sha) and store.path(sha).read_bytes() == src.read_bytes() and store.verify(sha)
    assert store.put_file(src) == sha and store.list() == [sha]
    assert list(store.staging.iterdir()) == []  # no temp files left behind
    with pytest.raises(ArtifactError):
        store.path("../../etc/passwd")
    assert hash_file(src, 1000)[2] == [hashlib.sha256(b"hello" * 200).hexdigest()] * 5


def test_gc_keeps_only_what_is_asked(tmp_path):
    store = ContentStore(tmp_path / "s")
    a, b = store.put_bytes(b"a" * 10), store.put_bytes(b"b" * 10)
    (store.staging / f"{b}.part").write_bytes(b"partial")
    assert store.gc({a}) == [b]
    assert store.list() == [a] and list(store.staging.iterdir()) == []


def test_staging_resumes_from_bitmap_and_recovers_unrecorded_chunks(tmp_path):
    store = ContentStore(tmp_path / "s")
    data = os.urandom(CHUNK * 10 + 100)
    art = artifact_of(data)
    st = Staging(store, art, persist_interval_s=1e9, persist_bytes=1 << 40).open()
    st.lookahead = 2
    for i in (0, 1, 2):
        st.note_requested(i)
        assert st.write(i, data[i * CHUNK : (i + 1) * CHUNK])
    st.persist()  # durable: chunks 0-2
    st.note_requested(4)
    assert st.write(4, data[4 * CHUNK : 5 * CHUNK])  # written, never persisted in the bitmap (a crash now)
    assert not st.write(5, b"x" * CHUNK)  # tampered chunk: refused, nothing written
    os.close(st._fd)
    st._fd = None  # simulate the kill: no final persist
    again = Staging(store, art).open()
    assert again.recovered == 1 and again.missing() == [3, 5, 6, 7, 8, 9, 10]
    for i in again.missing():
        assert again.write(i, data[i * CHUNK : (i + 1) * CHUNK])
    path = again.finish()
    assert path.read_bytes() == data and not store.bitmap_path(art.sha256).exists()
    assert not store.part_path(art.sha256).exists()


def test_commit_refuses_a_wrong_file_and_leaves_nothing(tmp_path):
    store = ContentStore(tmp_path / "s")
    data = os.urandom(CHUNK * 2)
    art = artifact_of(data)
    st = Staging(store, art).open()
    st.write(0, data[:CHUNK])
    os.pwrite(st._fd, b"z" * CHUNK, CHUNK)  # the disk holds garbage where chunk 1 should be
    st.have[1] = 1
    with pytest.raises(ArtifactError, match="discarded"):
        st.finish()
    assert not store.has(art.sha256) and list(store.staging.iterdir()) == []
