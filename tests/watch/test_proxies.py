"""The trainer's proxies: the stdlib event-file reader against tensorboardX's writer, trainer_state.json and
JSONL logs, the controller's validation of the host's answer, the step matching, and one read on a sandbox
host through the host-script path."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orchestrator.core.errors import InputError
from orchestrator.watch import proxy_host_script
from orchestrator.watch.proxies import DEFAULT_PROXIES, at_checkpoints, choose, parse_proxies, read_proxies


def write_run(folder: Path) -> None:
    """A trainer's logdir: an event file (simple_value and tensor scalars), a trainer_state.json in a
    checkpoint folder and a JSONL metrics log."""
    from tensorboardX import SummaryWriter
    from tensorboardX.proto.summary_pb2 import Summary
    from tensorboardX.proto.tensor_pb2 import TensorProto

    folder.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(str(folder / "tb"))
    for step in (100, 200, 300):
        writer.add_scalar("train/acc_0", 0.5 + step / 1000, step)
        tensor = TensorProto(dtype=1, float_val=[3.0 - step / 100])   # a tensor summary, as tf.summary writes
        writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag="train/ploss_0", tensor=tensor)]), step)
        writer.add_scalar("train/lr", 1e-4, step)
    writer.close()
    (folder / "checkpoint-300").mkdir(exist_ok=True)
    (folder / "checkpoint-300" / "trainer_state.json").write_text(json.dumps(
        {"global_step": 300, "log_history": [{"step": 100, "loss": 2.5}, {"step": 300, "loss": 1.5, "eval_loss": 1.7},
                                             {"step": 200, "loss": float("nan")}]}))
    (folder / "metrics.jsonl").write_text('{"step": 100, "val/tau_sim": 2.1}\n{"step": 300, "val/tau_sim": 2.4}\n{"ste')


def test_the_stdlib_reader_reads_what_tensorboardx_trainer_state_and_jsonl_logged(tmp_path):
    write_run(tmp_path / "run")
    doc = proxy_host_script.read_proxies(str(tmp_path / "run"), ["train/acc_0", "train/ploss_0", "loss",
                                                                 "eval_loss", "val/tau_sim"], 1 << 20, 1000)
    files = doc["files"]
    series = {tag: [[step, value] for step, value, _ in rows] for tag, rows in doc["series"].items()}
    origin = {tag: {files[f] for _, _, f in rows} for tag, rows in doc["series"].items()}
    assert [s for s, _ in series["train/acc_0"]] == [100, 200, 300]
    assert series["train/acc_0"][2][1] == pytest.approx(0.8, abs=1e-6)
    assert series["train/ploss_0"] == [[100, pytest.approx(2.0)], [200, pytest.approx(1.0)], [300, pytest.approx(0.0)]]
    assert series["loss"] == [[100, 2.5], [300, 1.5]]          # the NaN is dropped on the host already
    assert series["eval_loss"] == [[300, 1.7]]
    assert series["val/tau_sim"] == [[100, 2.1], [300, 2.4]]   # the torn last line is skipped
    assert origin["loss"] == {"checkpoint-300/trainer_state.json"} and origin["val/tau_sim"] == {"metrics.jsonl"}
    assert len(origin["train/acc_0"]) == 1 and next(iter(origin["train/acc_0"])).startswith("tb/events.out.")
    assert "train/lr" not in series                            # only the tags asked for
    assert any(f.endswith("trainer_state.json") for f in doc["files"])


def test_a_corrupt_record_ends_the_event_file_there(tmp_path):
    write_run(tmp_path / "run")
    event_file = next((tmp_path / "run" / "tb").iterdir())
    whole = proxy_host_script.read_event_file(str(event_file), 1 << 20)
    data = bytearray(event_file.read_bytes())
    data[-6] ^= 0xFF                                   # inside the last record's payload: its crc fails
    event_file.write_bytes(bytes(data))
    cut = proxy_host_script.read_event_file(str(event_file), 1 << 20)
    assert 0 < len(cut) < len(whole) and cut == whole[:len(cut)]
    assert proxy_host_script.read_event_file(str(event_file), 30) == []   # the byte bound holds


def test_the_hosts_answer_is_validated_and_losses_are_negated():
    doc = {"series": {"train/acc_0": [[100, 0.5], [200, float("nan")], [True, 0.6], [-5, 0.1], [300, "x"],
                                      [10 ** 13, 0.9], [400, 0.7], "junk"],
                      "loss": [[100, 2.0], [200, 1.0]]}}
    series = parse_proxies(doc, ["train/acc_0", "-loss"], "kpro6")
    assert series == {"train/acc_0": [(100, 0.5), (400, 0.7)], "-loss": [(100, -2.0), (200, -1.0)]}
    assert choose(series, DEFAULT_PROXIES) == "train/acc_0"
    assert choose({"-loss": [(1, -1.0)]}, DEFAULT_PROXIES) == "-loss"
    with pytest.raises(InputError, match="kpro6"):
        parse_proxies(["not", "a", "mapping"], ["loss"], "kpro6")


def test_each_checkpoint_gets_the_value_logged_at_or_since_the_previous_checkpoint():
    values = [(90, 0.1), (100, 0.2), (150, 0.3), (190, 0.35), (310, 0.5)]
    assert at_checkpoints(values, [100, 200, 300, 400]) == {100: (100, 0.2), 200: (190, 0.35), 400: (310, 0.5)}


def test_proxies_are_read_on_a_sandbox_host(sandbox, connector, tmp_path):
    folder = sandbox.hosts["kpro6"].checkpoints / f"proxies-{tmp_path.name[-16:]}"
    write_run(folder)
    series = read_proxies(connector, "kpro6", str(folder), ["train/acc_0", "-train/ploss_0", "-loss"])
    assert [s for s, _ in series["train/acc_0"]] == [100, 200, 300]
    assert series["-train/ploss_0"][0] == (100, pytest.approx(-2.0))
    assert series["-loss"] == [(100, -2.5), (300, -1.5)]
    assert all(math.isfinite(v) for rows in series.values() for _, v in rows)
