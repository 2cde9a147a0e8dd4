"""Cards as data on the controller: every shipped card loads and names its source, a bad card file is refused
naming the file and the field before anything connects, a card fills the options left at their default and
refuses one given with another value, and the payload gets the card as its own document."""

from __future__ import annotations

import dataclasses
import json

import pytest
from cli_runner import dfo

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import parse_inventory
from orchestrator.evaluation.plan import EvalRequest, parse_drafter, plan_eval
from remote_payload.cards.schema import load_card, shipped_names
from remote_payload.cli import build_parser
from remote_payload.errors import PayloadError
from remote_payload.eval.settings import check_values, settings_from_values

# Every host is unreachable (port 1): a refusal with exit 2 came before any connection.
INVENTORY = ("hosts:\n  ct129: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-c, roles: [eval]}\n"
             "  ct130: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-d}\n")
INV = parse_inventory(INVENTORY, "inventory.yaml")
ROWS = ["gsm8k=/data/gsm8k/test.jsonl"]  # GSM8K ships in no package: the rows' file on the eval host
GOOD = """card: team-gsm8k
source: owner/repo#12
target: {name: Qwen/Qwen3-8B}
drafter: {name: ours/drafter}
figure: {tau: 5.46, ci: [5.25, 5.48], n: 128}
count: committed
aggregation: per_request
protocol:
  dataset: gsm8k
  n: 128
  selection: server
  thinking: on
  temperature: 1.0
  top_p: 0.95
  top_k: 20
  draft_rule: sampled
  k: 7
  max_new_tokens: 4096
  engine: unknown
"""
BAD = [  # (what is wrong, the line replaced, the replacement, the field the error names)
    ("count", "count: committed", "count: tokens", "field count: expected committed | zlab | zlab-2604 | vllm"),
    ("thinking", "thinking: on", "thinking: maybe", "field protocol.thinking: expected on, off or unknown"),
    ("top_p", "top_p: 0.95", "top_p: 1.5", "field protocol.top_p: expected a number above 0 and at most 1"),
    ("figure ci", "ci: [5.25, 5.48]", "ci: [5.5, 5.9]", "field figure.ci: expected [lo, hi] around tau 5.46"),
    ("unknown key", "k: 7", "block: 8", "field protocol.block: not a card field"),
    ("dataset", "dataset: gsm8k", "dataset: gsm9k", "field protocol.dataset: 'gsm9k' is neither a benchmark"),
    ("engine", "engine: unknown", "engine: trt", "field protocol.engine: expected offline"),
    ("no source", "source: owner/repo#12", "sauce: x", "field sauce: not a card field"),
]


def test_every_shipped_card_loads_and_names_its_source():
    names = shipped_names()
    assert "zlab-qwen38-27b-dflash2-gsm8k-t1" in names and len(names) >= 2
    for name in names:
        card = load_card(name)
        assert card.card == name and card.source.startswith(("https://", "http://")) or "#" in card.source
        assert card.figure.tau > 1 and card.protocol.n >= 1
    dflash2 = load_card("zlab-qwen38-27b-dflash2-gsm8k-t1")  # the figure docs/rules-and-protocols.md states
    assert (dflash2.figure.tau, dflash2.protocol.thinking, dflash2.protocol.max_new_tokens) == (5.46, True, 4096)


@pytest.mark.parametrize("what, line, replacement, phrase", BAD, ids=[b[0] for b in BAD])
def test_a_bad_card_is_refused_before_anything_connects_naming_the_field(tmp_path, what, line, replacement,
                                                                          phrase):
    inv = tmp_path / "inventory.yaml"
    inv.write_text(INVENTORY)
    card = tmp_path / "card.yaml"
    assert line in GOOD
    card.write_text(GOOD.replace(line, replacement))
    proc = dfo("eval", "--host", "ct129", "--target", "/m/t", "--drafter", "z=/m/d", "--card", str(card),
               inventory=inv, runs=tmp_path / "runs")
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(card) in text and phrase in text, text
    assert "Traceback" not in proc.stdout + proc.stderr and not (tmp_path / "runs").exists()


def test_a_card_fills_the_options_and_the_payload_reads_the_same_card(tmp_path):
    card = tmp_path / "card.yaml"
    card.write_text(GOOD)
    req = EvalRequest(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)], card=str(card),
                      dataset_files=ROWS, explain=True)
    (job,) = plan_eval(req, INV).jobs
    args = job.args
    value = args[args.index("--card") + 1]
    assert json.loads(value)["card"] == "team-gsm8k"  # the document itself: nothing to upload
    s = settings_from_values(vars(build_parser().parse_args(args)))
    assert (s.datasets, s.selection, s.enable_thinking, s.temperature, s.top_p, s.top_k, s.max_new_tokens,
            s.draft_rule, s.explain) == (["gsm8k@128"], "zlab-server", True, 1.0, 0.95, 20, 4096, "sampled", True)
    shipped = EvalRequest(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)],
                          card="zlab-qwen38-27b-dflash2-gsm8k-t1", dataset_files=ROWS)
    (job,) = plan_eval(shipped, INV).jobs
    assert job.args[job.args.index("--card") + 1] == "zlab-qwen38-27b-dflash2-gsm8k-t1"


def test_an_option_given_with_another_value_than_the_card_is_refused(tmp_path):
    card = tmp_path / "card.yaml"
    card.write_text(GOOD)
    req = EvalRequest(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)], card=str(card),
                      dataset_files=ROWS, temperature=0.6)
    with pytest.raises(InputError, match=r"--card team-gsm8k fixes what it measures, but --temperature 0.6 "
                                         r"\(the card: 1\)"):
        plan_eval(req, INV)
    with pytest.raises(InputError, match="--card and --protocol"):
        plan_eval(EvalRequest(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)],
                              card=str(card), protocol="zlab-card-gsm8k-t1", dataset_files=ROWS), INV)
    with pytest.raises(PayloadError, match="--explain ranks the knobs behind a gap"):
        check_values(settings_from_values(vars(build_parser().parse_args(
            ["eval", "--target", "/t", "--drafter", "z=/d", "--explain"]))))


def test_an_unknown_field_takes_the_run_value_and_a_clash_on_it_is_no_clash(tmp_path):
    card = tmp_path / "card.yaml"
    card.write_text(GOOD.replace("thinking: on", "thinking: unknown").replace("max_new_tokens: 4096",
                                                                             "max_new_tokens: unknown"))
    req = EvalRequest(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)], card=str(card),
                      dataset_files=ROWS, max_new_tokens=64)
    (job,) = plan_eval(req, INV).jobs
    s = settings_from_values(vars(build_parser().parse_args(job.args)))
    assert (s.max_new_tokens, s.enable_thinking) == (64, False)


def test_the_plan_states_the_card_and_the_cost_of_explain(tmp_path):
    inv = tmp_path / "inventory.yaml"
    inv.write_text(INVENTORY)
    proc = dfo("eval", "--host", "ct129", "--target", "/m/t", "--drafter", "z=/m/d", "--card",
               "zlab-qwen3-8b-dflash-b16-humaneval-t0", "--explain", "--dry-run", inventory=inv, runs=tmp_path / "r")
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "card zlab-qwen3-8b-dflash-b16-humaneval-t0 (https://huggingface.co/z-lab/Qwen3-8B-DFlash-b16): τ 6.55" \
        in text
    # max new tokens, the selection and T = 0 are the card's (top-p and top-k do not enter at T = 0): thinking, the
    # drafter's template, float32 (the run's dtype is bfloat16) and the normalised prompts (decoded again) and the
    # two layer offsets (extracted again), each on 16 of the 164 rows
    assert ("--explain: the free knobs (count, aggregation, draft_rule, k, end_rule) from the run's own samples, no "
            "extra pass; subset reruns of the first 16 row(s): thinking on, chat_template drafter, dtype float32, "
            "layer_offset -1, layer_offset +1, prompt_normalization repeated newlines collapsed; at most ≈ 0.39× the "
            "run's reference decoding (4 rerun(s) of 16 of its 164 row(s), each up to its max new tokens) and 0.59× "
            "its feature extraction; references already cached are read back; dtype float32 loads the target once "
            "more in it; chat_template only where the drafter ships the template it was trained with") in text
    assert "--explain --explain-prompts" not in text and "--card zlab-qwen3-8b-dflash-b16-humaneval-t0" in text


def test_a_card_on_a_prompts_file_reads_it_beside_the_card_and_uploads_it(tmp_path):
    inv = tmp_path / "inventory.yaml"
    inv.write_text(INVENTORY)
    (tmp_path / "cards").mkdir()
    (tmp_path / "cards" / "mine.jsonl").write_text('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n')
    card = tmp_path / "cards" / "card.yaml"
    card.write_text(GOOD.replace("dataset: gsm8k", "dataset: mine.jsonl").replace("n: 128", "n: 2")
                    .replace("selection: server", "selection: file"))
    proc = dfo("eval", "--host", "ct129", "--target", "/m/t", "--drafter", "z=/m/d", "--card", str(card),
               "--dry-run", "--json", inventory=inv, runs=tmp_path / "r")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job,) = json.loads(proc.stdout)["plan"]["jobs"]
    args = job["args"]
    remote = args[args.index("--prompts") + 1]
    assert remote == job["prompts_upload"] and args[args.index("--samples") + 1] == "2"
    assert json.loads(args[args.index("--card") + 1])["protocol"]["dataset"] == remote  # where the job reads it


def test_explain_runs_on_one_host(tmp_path):
    card = tmp_path / "card.yaml"
    card.write_text(GOOD)
    req = EvalRequest(hosts=["ct129", "ct130"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)],
                      card=str(card), dataset_files=ROWS, explain=True)
    with pytest.raises(InputError, match="--explain reruns the first rows of one host's share"):
        plan_eval(req, INV)
    assert len(plan_eval(dataclasses.replace(req, explain=False), INV).jobs) == 2  # the verdict alone: any hosts
