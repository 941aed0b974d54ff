"""The state directory's format stamp (issue 40): a release refuses, before writing anything, a state written for
readers newer than it; it stamps its own format without ever lowering a newer one; an unstamped directory reads."""

from __future__ import annotations

import json

import pytest

from agent.errors import LifecycleError
from agent.lifecycle import stateformat
from agent.lifecycle.control import StateLock


def test_an_unstamped_state_is_stamped_once(tmp_path):
    assert stateformat.read(tmp_path)["format"] == 0
    doc = stateformat.claim(tmp_path)
    assert (doc["format"], doc["min_reader"]) == (stateformat.STATE_FORMAT, stateformat.MIN_READER)
    assert json.loads((tmp_path / stateformat.NAME).read_text()) == doc


def test_a_newer_compatible_format_is_read_and_kept(tmp_path):
    newer = {"format": stateformat.STATE_FORMAT + 1, "min_reader": stateformat.READS_UP_TO, "written_by": "9.0"}
    (tmp_path / stateformat.NAME).write_text(json.dumps(newer))
    assert stateformat.claim(tmp_path) == newer  # N-1 after a failed trial of N+1: reads it, does not lower it
    assert json.loads((tmp_path / stateformat.NAME).read_text()) == newer


def test_a_state_for_newer_readers_is_refused_before_the_lock_is_kept(tmp_path):
    doc = {"format": 7, "min_reader": stateformat.READS_UP_TO + 1, "written_by": "9.0"}
    (tmp_path / stateformat.NAME).write_text(json.dumps(doc))
    with pytest.raises(LifecycleError, match="needs a reader of format"):
        StateLock(tmp_path).acquire()
    (tmp_path / stateformat.NAME).unlink()
    StateLock(tmp_path).acquire().release()  # the refused one let go of the lock
    assert stateformat.read(tmp_path)["format"] == stateformat.STATE_FORMAT
