"""``$DFO_FIXTURE_THREADS``: the fixtures built under another torch thread count, the portability check of the
engine agreement (docs/engines.md: another thread count sums in another order, as another machine's
floating-point path does). The count keys the cache, so two builds never mix; a bad value is refused."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO

from remote_payload.fixtures import build as fx
from remote_payload.fixtures.models import THREADS


def test_the_thread_count_is_part_of_the_cache_key(monkeypatch):
    monkeypatch.delenv(fx.THREADS_ENV, raising=False)
    default = fx.build_key()
    assert fx.build_threads() == THREADS
    monkeypatch.setenv(fx.THREADS_ENV, str(THREADS))
    assert fx.build_key() == default  # the default count named explicitly is the same build
    monkeypatch.setenv(fx.THREADS_ENV, str(THREADS + 2))
    assert fx.build_threads() == THREADS + 2 and fx.build_key() != default


def test_a_bad_thread_count_is_refused_before_anything_is_written(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    for bad in ("0", "two", "-1"):
        proc = subprocess.run([sys.executable, "-m", "remote_payload", "fixtures", "--out", str(out), "--what",
                               "tokenizer"], cwd=REPO, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "DFO_FIXTURE_THREADS": bad,
                                   "DFO_FIXTURE_CACHE": str(cache)})
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == (f"dfo-payload error: $DFO_FIXTURE_THREADS={bad!r}: expected a whole number "
                                       f"of threads >= 1 (the torch thread count the fixtures are built with); "
                                       f"unset it for the default ({THREADS})")
        assert not out.exists() and not cache.exists()
