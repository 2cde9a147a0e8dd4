"""`dfo watch --proxy-logdir`: the trainer's proxy read on a sandbox host after each checkpoint, recorded
beside τ, checked, and its alert carried to series.md, `series show`, the plot, TensorBoard and the series
files; the fake trainer's stdlib event writer read back by TensorBoard's own reader."""

from __future__ import annotations

import json

import pytest
import series_data
from cli_runner import dfo
from test_series_scale import _read_scalars

from orchestrator.core.errors import InputError
from orchestrator.core.events import Events, QuietEvents
from orchestrator.testing.fake_trainer import log_proxy
from orchestrator.watch import series as series_state
from orchestrator.watch import tensorboard
from orchestrator.watch.plot import write_plot
from orchestrator.watch.proxy_step import ProxyOptions, ProxyWatch, proxy_options, take_diagnosis
from orchestrator.watch.render import series_markdown

# τ follows the proxy for four checkpoints, then falls while the proxy keeps climbing.
TAUS = {100: 2.0, 200: 2.3, 300: 2.6, 400: 2.85, 500: 2.3, 600: 1.9, 700: 1.8}
ACC = {100: 0.5, 200: 0.6, 300: 0.7, 400: 0.8, 500: 0.85, 600: 0.9, 700: 0.92}


def test_the_fake_trainers_event_file_reads_back_with_tensorboards_reader(tmp_path):
    for step, acc in ACC.items():
        log_proxy(tmp_path, "train/acc_0", step, acc)
    assert _read_scalars(tmp_path)["train/acc_0"] == [(s, round(v, 4)) for s, v in ACC.items()]


def test_proxy_options():
    assert proxy_options(None, [], "/ck/run7") is None
    assert proxy_options(None, ["-loss"], "/ck/run7/") == ProxyOptions("/ck/run7", ("-loss",))
    assert proxy_options("/tb/run7", [], "/ck").proxies[0] == "train/acc_0"
    with pytest.raises(InputError, match="absolute"):
        proxy_options("tb/run7", [], "/ck")
    with pytest.raises(InputError, match="not a tag name"):
        proxy_options("/tb", ["-"], "/ck")


class Said(QuietEvents):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def warn(self, text: str) -> None:
        self.lines.append(text)


def _follow(connector, logdir: str, proxies: tuple[str, ...], events: Events) -> dict:
    """Checkpoints recorded one by one as the watcher records them, the proxy step after each."""
    s = series_state.new_series("run7", source="kpro6:/d", eval_host="ct129",
                                settings={"target": "/m/t", "samples": 8, "prompts": "builtin",
                                          "max_new_tokens": 64, "dtype": "float32"})
    published: list[str] = []
    watch = ProxyWatch(connector, "kpro6", ProxyOptions(logdir, proxies), events, lambda e: published.append(e["name"]))
    for step, tau in TAUS.items():
        e = series_data.entry(step, tau)
        e["measures"]["tau_macro"]["ci"] = [tau - 0.1, tau + 0.1]
        s["checkpoints"][e["name"]] = e
        if step == 700 and len(proxies) > 1:
            assert take_diagnosis(s, e["name"], lambda x: published.append(x["name"]))["step"] == 600
        watch.after(s, e)
    return s


def test_the_proxy_is_read_on_a_sandbox_host_and_the_alert_fires_where_tau_parts(sandbox, connector, tmp_path):
    kpro6 = sandbox.hosts["kpro6"].checkpoints
    tb = kpro6 / f"proxy-tb-{tmp_path.name[-16:]}"
    for step, acc in ACC.items():
        log_proxy(tb / "logs", "train/acc_0", step, acc)
    s = _follow(connector, str(tb), ("train/acc_0", "-loss"), QuietEvents())
    done = series_state.done_entries(s)
    assert [e["proxy"]["value"] for e in done] == [pytest.approx(a) for a in ACC.values()]
    assert {(e["proxy"]["name"], e["proxy"]["source"], e["proxy"]["logdir"]) for e in done} == \
        {("train/acc_0", "tensorboard", f"kpro6:{tb}")}
    assert [e["step"] for e in done if (e.get("proxy_check") or {}).get("disagrees")] == [500, 600, 700]
    alerts = [e for e in done if e.get("proxy_alert")]
    assert [(e["step"], e["proxy_alert"]["kind"], e["proxy_alert"]["since"]) for e in alerts] == [(600, "diverge", 400)]
    assert alerts[0]["proxy_alert"]["text"].startswith("τ and the proxy part: train/acc_0 up 12 %, τ down 33 %")
    assert alerts[0]["proxy_alert"]["diagnosed_in"] == "step_700.pt"

    # trainer_state.json: the loss as the proxy (lower is better), from a Hugging Face Trainer's checkpoint folder.
    hf = kpro6 / f"proxy-hf-{tmp_path.name[-16:]}"
    (hf / "checkpoint-700").mkdir(parents=True)
    history = [{"step": step, "loss": round(2.0 - acc, 3)} for step, acc in ACC.items()]
    (hf / "checkpoint-700" / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    said = Said()
    s_hf = _follow(connector, str(hf), ("train/acc_0", "-loss"), said)
    hf_done = series_state.done_entries(s_hf)
    assert hf_done[0]["proxy"] == {"name": "-loss", "value": 1.5, "logged_step": 100, "source": "trainer_state.json",
                                   "logdir": f"kpro6:{hf}", "file": "checkpoint-700/trainer_state.json"}
    assert [e["step"] for e in hf_done if e.get("proxy_alert")] == [600]
    assert said.lines == []

    # A logdir with no proxy is said once; a missing one is a warning each time, never an exception.
    said = Said()
    _follow(connector, str(hf / "nothing-here"), ("train/acc_0",), said)
    assert len(said.lines) == len(TAUS) and "were not read" in said.lines[0] and "is not a folder" in said.lines[0]
    said = Said()
    _follow(connector, str(tb), ("val/tau_sim",), said)
    assert len(said.lines) == 1 and "none of the proxies val/tau_sim is logged" in said.lines[0]

    # Where watch results go: series.json (the loader checks the new fields), series.md, the plot, TensorBoard.
    folder = tmp_path / "runs" / "series" / "run7"
    series_state.save(folder, s)
    again = series_state.load_series(folder)
    assert again["checkpoints"]["step_600.pt"]["proxy_alert"]["since"] == 400
    assert [p.get("proxy", {}).get("value") for p in again["steps"]] == [pytest.approx(a) for a in ACC.values()]
    md = series_markdown(again, plotted=False)
    assert "train/acc\\_0 from TensorBoard events in" in md or "train/acc_0 from TensorBoard events in" in md
    assert "**alert** step 600 (step\\_600.pt): τ and the proxy part" in md or \
        "**alert** step 600 (step_600.pt): τ and the proxy part" in md
    row500 = next(line for line in md.splitlines() if line.startswith("| 500 |"))
    assert row500.endswith("| 0.85 ! |")
    assert write_plot(folder, again).stat().st_size > 20_000
    data = tensorboard.event_bytes(series_state.done_entries(again))
    tensorboard.write_local(tmp_path / "tb", tensorboard.file_name("run7", 100, now=1), data)
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    (path,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    values = [(event.step, v) for event in EventFileLoader(str(path)).Load() for v in event.summary.value]
    assert [(step, round(v.tensor.float_val[0], 4)) for step, v in values if v.tag == "dflash_proxy/train_acc_0"] \
        == [(s, round(a, 4)) for s, a in ACC.items()]
    texts = [(step, v.tensor.string_val[0].decode()) for step, v in values if v.tag.startswith("dflash/proxy_alert")]
    assert [step for step, _ in texts] == [600] and texts[0][1].endswith("since step 400")
    shown = dfo("series", "show", "run7", runs=tmp_path / "runs")
    assert shown.returncode == 0, shown.stderr
    assert "0.85 !" in shown.stdout and "alert step 600" in " ".join(shown.stdout.split())
    assert "higher is better" in shown.stdout


def test_an_old_series_reads_as_before_and_a_bad_proxy_field_is_named(tmp_path):
    folder = tmp_path / "run7"
    s = series_state.new_series("run7", source="kpro6:/d", eval_host="ct129", settings={})
    e = series_data.entry(100)
    s["checkpoints"][e["name"]] = e
    series_state.save(folder, s)
    assert "proxy" not in series_state.load_series(folder)["steps"][0]
    assert "## The trainer's proxy" not in series_markdown(s, plotted=False)
    e["proxy"] = {"name": "train/acc_0", "value": "high", "logged_step": 100}
    series_state.save(folder, s)
    with pytest.raises(InputError, match=r"checkpoints\.step_100\.pt\.proxy: expected"):
        series_state.load_series(folder)


def test_the_on_result_payload_carries_the_proxy_and_its_alert(connector, tmp_path):
    from orchestrator.evaluation.plan import EvalRequest
    from orchestrator.watch.config import WatchConfig
    from orchestrator.watch.loop import Watcher

    got = tmp_path / "hook.json"
    cfg = WatchConfig(series="run7", source_host="kpro6", folder="/x", request=EvalRequest(hosts=["ct129"], target="/x",
                      drafters=[]), runs_dir=tmp_path / "runs", resident=False, on_result=f"cat > {got}",
                      proxy=ProxyOptions("/tb"))
    watcher = Watcher(connector, cfg, QuietEvents())
    watcher.series = series_state.new_series("run7", source="kpro6:/x", eval_host="ct129", settings={})
    e = series_data.entry(600, 1.9)
    e["proxy"] = {"name": "train/acc_0", "value": 0.9, "logged_step": 600, "source": "tensorboard",
                  "logdir": "kpro6:/tb"}
    e["proxy_check"] = {"predicted": 3.2, "z": -7.0, "disagrees": True}
    e["proxy_alert"] = {"kind": "diverge", "since": 400, "text": "τ and the proxy part: …"}
    watcher.series["checkpoints"][e["name"]] = e
    watcher._hook(e)
    payload = json.loads(got.read_text())
    assert payload["proxy"]["name"] == "train/acc_0" and payload["proxy_check"]["disagrees"] is True
    assert payload["proxy_alert"]["since"] == 400
