"""``runlog.projections.log_reader.progress_bar``: a tqdm bar on the stream it is given, nothing elsewhere."""

from __future__ import annotations

import io

import pytest

from runlog.projections.log_reader import progress_bar


def test_no_stream_no_bar(capsys: pytest.CaptureFixture[str]) -> None:
    with progress_bar(None, "rebuild") as tick:
        assert tick is None
    assert capsys.readouterr() == ("", "")


def test_the_bar_goes_to_its_stream_only_and_ends_with_a_newline(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    with progress_bar(out, "audit") as tick:
        assert tick is not None
        tick(0, 40)
        tick(25, 40)
        tick(40, 40)
    text = out.getvalue()
    assert text.startswith("\raudit:") and text.endswith("\n")
    assert "40/40" in text and "records/s" in text
    assert capsys.readouterr() == ("", "")


def test_an_empty_range_still_closes_its_line() -> None:
    out = io.StringIO()
    with progress_bar(out, "rebuild") as tick:
        assert tick is not None
        tick(0, 0)
    assert out.getvalue().startswith("\rrebuild:") and out.getvalue().endswith("\n")
