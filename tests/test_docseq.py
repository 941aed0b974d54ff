"""The device's document sequence (agent.transport.docseq) on real files: two processes taking numbers at the
same time get distinct ones and the file ends at the total; the counter survives a new process; an unreadable
or malformed file is an error naming it, never a silent restart from 0; a floor moves it above."""

from __future__ import annotations

import json
import multiprocessing

import pytest

from agent.errors import ConfigError
from agent.transport import docseq


def _take_many(state_dir, n, out):
    out.put([docseq.take(state_dir) for _ in range(n)])


def test_two_processes_never_get_the_same_number_and_it_never_goes_back(tmp_path):
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: nothing shared but the files
    out = ctx.Queue()
    procs = [ctx.Process(target=_take_many, args=(tmp_path, 40, out)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert all(a < b for nums in got for a, b in zip(nums, nums[1:]))  # each process's own numbers rise
    assert sorted(got[0] + got[1]) == list(range(1, 81))
    assert json.loads((tmp_path / docseq.FILE).read_text()) == {"seq": 80} and docseq.current(tmp_path) == 80
    assert docseq.take(tmp_path) == 81  # another process later: it goes on
    assert docseq.advance(tmp_path, 500) == 501 and docseq.advance(tmp_path, 10) == 502


@pytest.mark.parametrize("text", ["{not json", '{"seq": -3}', '{"seq": "7"}', "[1]"])
def test_an_unreadable_counter_is_an_error_not_a_restart(tmp_path, text):
    (tmp_path / docseq.FILE).write_text(text)
    with pytest.raises(ConfigError, match=r"doc-seq\.json"):
        docseq.take(tmp_path)
    assert (tmp_path / docseq.FILE).read_text() == text  # left as it was for the operator to see
