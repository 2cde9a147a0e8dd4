"""The engine stage's pure parts: settings checks, the z-lab export vLLM loads, and when a drafter needs it.
(Serving itself runs against a real vLLM in tests/engine.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from remote_payload.cli import main
from remote_payload.errors import PayloadError
from remote_payload.eval.engine_ready import not_loadable
from remote_payload.eval.settings import EvalSettings, check_engine_settings
from remote_payload.models.checkpoint import load_drafter
from remote_payload.models.export import spec_to_zlab_config, write_zlab_folder


def _settings(**kw) -> EvalSettings:
    return EvalSettings(target="/t", drafters=[("a", "/d")], **kw)


def test_engine_settings_are_checked(tmp_path):
    with pytest.raises(PayloadError, match="--engine vllm needs --engine-python PATH"):
        check_engine_settings(_settings(engine="vllm"))
    with pytest.raises(PayloadError, match="--reference vllm needs --engine-python"):
        check_engine_settings(_settings(reference_engine="vllm"))
    with pytest.raises(PayloadError, match="--engine 'tgi': unknown engine"):
        check_engine_settings(_settings(engine="tgi", engine_python="/x"))
    with pytest.raises(PayloadError, match=f"--engine-python {tmp_path}/py: no such file"):
        check_engine_settings(_settings(engine="vllm", engine_python=str(tmp_path / "py")))
    py = tmp_path / "python"
    py.write_text("")
    with pytest.raises(PayloadError, match="one source"):
        check_engine_settings(_settings(reference_engine="vllm", reference_url="http://x", engine_python=str(py)))
    check_engine_settings(_settings(engine="vllm", reference_engine="vllm", engine_python=str(py)))


def test_engine_check_and_a_pinned_release(tmp_path):
    import sys

    from remote_payload.eval.engine_setup import EngineRun, _prepare

    with pytest.raises(PayloadError, match="--engine-check synthetic needs --engine NAME"):
        check_engine_settings(_settings(engine_check=("synthetic",)))
    # --engine vllm@0.31.0 against a venv without that release (here: none at all): refused, naming both
    s = _settings(engine="vllm", engine_version="0.31.0", engine_python=sys.executable)
    with pytest.raises(PayloadError, match=r"--engine vllm@0.31.0: the engine venv .* has vllm \(none found\) "
                                           r"\(provision that release: `dfo provision --host HOST --engine "
                                           r"vllm@0.31.0`\)"):
        _prepare(SimpleNamespace(settings=s), EngineRun())


def test_cli_without_engine_python_is_one_error_line(capsys):
    code = main(["eval", "--target", "/nonexistent", "--drafter", "a=/nonexistent", "--engine", "vllm"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("dfo-payload error: --engine vllm needs --engine-python")


def test_export_carries_vocab_size_and_the_window_vllm_reads(loaded, tmp_path):
    training = loaded["training"]  # one sliding-window layer and one full one
    window = next(a.window for a in training.spec.attn if a.window)
    cfg = spec_to_zlab_config(training.spec, 512)
    assert cfg["vocab_size"] == 512 and cfg["layer_types"] == [a.kind for a in training.spec.attn]
    assert cfg["dflash_config"]["use_swa"] is True and cfg["dflash_config"]["swa_window_size"] == window
    assert "vocab_size" not in spec_to_zlab_config(training.spec)  # unknown: left out, as before
    write_zlab_folder(tmp_path / "out", training.spec, training.weights, vocab_size=512)
    again = load_drafter(tmp_path / "out")
    assert again.spec.attn == training.spec.attn and again.spec.fc_layer_ids == training.spec.fc_layer_ids
    assert not_loadable(again, tmp_path / "out", 512) is None


def test_which_drafters_need_an_export(loaded, fixture_dir, tmp_path):
    assert not_loadable(loaded["training"], fixture_dir / "trained-drafter" / "checkpoint.pt", 512) == \
        "training format"
    zlab = fixture_dir / "zlab-drafter"
    reason = not_loadable(loaded["zlab"], zlab, 512)
    vocab = json.loads((zlab / "config.json").read_text()).get("vocab_size")
    assert (reason is None) == (vocab == 512)
    fake = SimpleNamespace(source={"format": "zlab"}, spec=loaded["zlab"].spec)
    folder = tmp_path / "z"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 512, "dflash_config": {}}))
    assert not_loadable(fake, folder, 512) == "sliding-window layers without a window in config.json"
    (folder / "config.json").write_text(json.dumps({"vocab_size": 1000, "sliding_window": 64}))
    assert not_loadable(fake, folder, 512) == "config.json vocab_size 1000 is not the target's 512"
