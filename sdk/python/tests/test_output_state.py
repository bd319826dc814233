"""The output stream's state shared by the sync and async processes, without a
daemon: what a re-attach sends again is dropped, chunks wait for the reader's
choice in arrival order, and a stream error is raised."""

from __future__ import annotations

import base64
import json

import pytest

from sandlot import _output, errors
from sandlot.models import OutputChunk


def chunk(stream: str, data: bytes, offset: int) -> str:
    return json.dumps({"type": stream, "data": base64.b64encode(data).decode(), "offset": offset})


def test_a_reattach_drops_what_was_delivered_and_keeps_the_rest() -> None:
    s = _output.OutputState()
    assert s.event(chunk("stdout", b"hello ", 0)) == OutputChunk("stdout", b"hello ", 0)
    # The re-attach from offset 0 (say, after a lost connection) sends it again,
    # then more, overlapping what was seen.
    assert s.params() == {"stdout_from": 6, "stderr_from": 0}
    assert s.event(chunk("stdout", b"hello ", 0)) is None
    assert s.event(chunk("stdout", b"o world", 4)) == OutputChunk("stdout", b"world", 6)
    assert s.event(chunk("stderr", b"e", 0)) == OutputChunk("stderr", b"e", 0)
    assert s.params() == {"stdout_from": 11, "stderr_from": 1}


def test_an_attached_line_moves_the_offsets_past_output_no_longer_kept() -> None:
    s = _output.OutputState(from_offsets=(2, 0))
    assert s.event(json.dumps({"type": "attached", "stdout_from": 10, "stderr_from": 0})) is None
    assert s.event(chunk("stdout", b"0123456789ab", 0)) == OutputChunk("stdout", b"ab", 10)


def test_chunks_wait_for_the_readers_choice_in_arrival_order() -> None:
    s = _output.OutputState()
    a = OutputChunk("stdout", b"a", 0)
    b = OutputChunk("stderr", b"b", 0)
    assert s.hold(a) and s.hold(b)
    assert s.choose(_output.MERGED) == [a, b]
    assert s.choose(_output.MERGED) == []
    assert not s.hold(OutputChunk("stdout", b"c", 1))
    with pytest.raises(RuntimeError, match="not both"):
        s.choose(_output.SPLIT)


def test_exit_record_and_error_lines() -> None:
    s = _output.OutputState()
    assert s.event("") is None
    ev = s.event(json.dumps({"type": "exit", "exit": {"code": 3}}))
    assert isinstance(ev, _output.Exited) and ev.status.returncode == 3
    with pytest.raises(errors.StreamError, match="gone") as e:
        s.event(json.dumps({"type": "error", "error": {"code": "gone", "message": "output gone"}}))
    assert e.value.code == "gone"
