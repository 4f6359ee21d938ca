"""The runtime's result line taken out of an output stream (``task/output.py`` ``ResultLines``): pure, no engine.

Docker, Kubernetes and Ray read it with this one scanner; the task's own code writes to the same stream.
"""

from __future__ import annotations

import pytest

from airflow_gpu_provider.runtime.protocol import RESULT_MARKER
from airflow_gpu_provider.task.output import ResultLines
from airflow_gpu_provider.task.result import ResultError, result_in_log, result_of_lines

MARKER = RESULT_MARKER.encode()


def scan(stream: bytes, *, limit: int = 1000, piece: int | None = None) -> tuple[bytes, bytes | None, bool]:
    """What passes on, the result line and whether one was too large, fed in pieces of ``piece`` bytes."""
    lines, out, size = ResultLines(limit), b"", piece or len(stream) or 1
    for start in range(0, len(stream), size):
        out += lines.feed(stream[start : start + size])
    return out + lines.flush(), lines.line, lines.too_large


@pytest.mark.parametrize("piece", [None, 1, 2, 3, 7])
def test_the_runtimes_line_is_taken_out_after_output_left_without_a_line_end(piece):
    # the runtime writes "\n" first: output without a line end (printf foo) never hides its result
    assert scan(b"foo\n" + MARKER + b'{"ok": true}\n', piece=piece) == (b"foo\n", b'{"ok": true}', False)
    assert scan(b"a\n\n" + MARKER + b"1\n" + b"b\n", piece=piece) == (b"a\n" + b"b\n", b"1", False)


@pytest.mark.parametrize("piece", [None, 1, 4])
def test_only_a_marker_at_a_line_start_counts_and_the_rest_passes_on_unchanged(piece):
    stream = b"x " + MARKER + b"1\n[gp\n[gpu] resu\n\n\n" + MARKER[:-1] + b"\ntail"
    assert scan(stream, piece=piece) == (stream, None, False)


@pytest.mark.parametrize("piece", [None, 1, 5])
def test_the_last_whole_line_wins_a_too_large_or_unended_one_is_never_held(piece):
    forged, runtime = MARKER + b'{"return_value": 666}\n', b"\n" + MARKER + b'{"return_value": 7}\n'
    assert scan(forged + runtime, piece=piece)[1] == b'{"return_value": 7}'
    huge = MARKER + b"y" * 5000 + b"\n"  # dropped as it comes: memory stays at the limit
    assert scan(runtime + huge, piece=piece) == (b"", None, True)
    assert scan(runtime + b"\n" + MARKER + b'{"cut', piece=piece) == (b"", b'{"return_value": 7}', False)


def lines_of(stream: bytes, limit: int = 1000) -> ResultLines:
    lines = ResultLines(limit)
    lines.feed(stream)
    return lines


def test_a_result_line_parses_to_an_object_or_is_refused_by_name():
    assert result_of_lines(lines_of(b"no result\n"), "container x") is None
    assert result_of_lines(lines_of(MARKER + b'{"ok": true}\n'), "container x") == {"ok": True}
    for bad in (b"[1]", b"not json", b'"text"'):
        with pytest.raises(ResultError, match="output of container x is not the runtime's"):
            result_of_lines(lines_of(MARKER + bad + b"\n"), "container x")
    with pytest.raises(ResultError, match="output of container x is larger than"):
        result_of_lines(lines_of(MARKER + b"1" * 20 + b"\n", limit=10), "container x")
    assert result_in_log('epoch 1\n\n[gpu] result: {"ok": false}\n', "rank 0") == {"ok": False}
