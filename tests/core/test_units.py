"""Sizes and rates (orchestrator/core/units.py): --bwlimit reads units as rsync does and refuses a bare number."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import InputError
from orchestrator.core.units import human_bytes, parse_rate

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@pytest.mark.parametrize("text, value", [
    ("50M", 50 * MiB), ("1G", GiB), ("800K", 800 * KiB), ("800k", 800 * KiB), ("1.5M", 1.5 * MiB),
    ("20MiB/s", 20 * MiB), ("1kib", KiB), ("800KB", 800_000), ("2MB/s", 2_000_000), ("50000B", 50_000),
    ("50 M", 50 * MiB), (".5G", GiB / 2), (None, None), ("", None),
])
def test_a_rate_with_a_unit_is_bytes_per_second_as_rsync_reads_it(text, value):
    assert parse_rate(text) == value


@pytest.mark.parametrize("text, says", [
    ("50000", "a bare number is ambiguous"), ("1.5", "a bare number is ambiguous"),
    ("fast", "expected a rate like 800K"), ("-1M", "expected a rate like 800K"), ("1e3K", "expected a rate"),
    ("M", "expected a rate"), ("5BB", "expected a rate"), ("0M", "must be more than 0"), ("0B", "must be more than 0"),
])
def test_a_rate_without_a_unit_or_not_a_rate_is_refused_with_what_to_write(text, says):
    with pytest.raises(InputError, match=says) as err:
        parse_rate(text)
    assert err.value.hint
    if "bare number" in says:  # the hint spells out both readings of the number as they would be typed
        assert f"--bwlimit {text}K" in err.value.hint and f"--bwlimit {text}B" in err.value.hint


def test_human_bytes():
    assert (human_bytes(512), human_bytes(1536), human_bytes(17 * GiB), human_bytes(None)) == \
        ("512 B", "1.5 KiB", "17.0 GiB", "?")
