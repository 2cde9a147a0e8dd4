"""`eval --decode-batch 8` against `--decode-batch 1` through the real eval on the tiny hybrid fixture: the same
draws token for token, the same τ to the last digit, and the batch in the settings and the reference block."""

from __future__ import annotations

import json

from payload_helpers import read_results

from remote_payload.eval.pipeline import run_eval
from remote_payload.eval.settings import EvalSettings


def _run(fixture_dir, work, decode_batch):
    settings = EvalSettings(target=str(fixture_dir / "target"), drafters=[("ours", str(fixture_dir / "zlab-drafter"))],
                            samples=2, max_new_tokens=24, dtype="float32", temperature=1.0, top_p=0.9, top_k=20,
                            samples_per_prompt=2, decode_batch=decode_batch, cache_dir=str(work / "cache"),
                            out=str(work / "run"))
    results = run_eval(settings)
    _, lines = read_results(work / "run")
    return results, lines


def _cached_tokens(work):
    files = sorted((work / "cache" / "references").glob("*.json"))
    return {f.name: (e["continuation"], e["tail"]) for f in files if (e := json.loads(f.read_text()))}


def test_decode_batch_8_gives_the_draws_and_tau_of_batch_1(fixture_dir, tmp_path):
    one, one_lines = _run(fixture_dir, tmp_path / "b1", 1)  # each run its own cache: both decode
    eight, eight_lines = _run(fixture_dir, tmp_path / "b8", 8)
    def same(line):  # all but how long it took
        return {k: v for k, v in line.items() if k != "reference"}

    assert [same(x) for x in eight_lines] == [same(x) for x in one_lines]
    assert _cached_tokens(tmp_path / "b8") == _cached_tokens(tmp_path / "b1")  # the drawn tokens and their tails
    assert eight["drafters"]["ours"]["metrics"] == one["drafters"]["ours"]["metrics"]
    assert (one["settings"]["decode_batch"], eight["settings"]["decode_batch"]) == (1, 8)
    dec = eight["reference"]["decode"]
    assert (dec["batch_asked"], dec["batch"], dec["rows"], dec["out_of_memory_at"]) == (8, 8, 8, [])  # 4 draws,
    assert one["reference"]["decode"]["batch"] == 1 and dec["idle_share"] is not None  # 4 tails
