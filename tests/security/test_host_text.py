"""Host text on the operator's terminal and in report.md / series.md (issue 19, finding 3 and its lows).

A host chooses the characters of drafter names, reasons, warnings, log lines, error messages and
checkpoint names. On a terminal, ESC sequences (OSC 52 writes the clipboard, OSC 8 draws links, OSC 0
retitles, CSI erases, scrolls or asks the terminal to type an answer), C1 controls, backspace, DEL and a
lone CR are commands, and rich markup in the text applies ([conceal], [link=…]) or raises ([/x]). In
Markdown, HTML renders (a tracking <img>), '|' and newlines break table rows, backticks close a fence.

The tests run the dfo CLI on run folders and series whose files hold such text, and jobs on a sandbox
host whose logs and replies hold it, and assert on the bytes the CLI wrote and on report.md / series.md
as a Markdown renderer reads them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_runner import dfo
from hostile import HostileHost
from markdown_it import MarkdownIt
from waiting import wait_for

import orchestrator
from orchestrator.core.host_text import clean, md_code, md_fence, md_text
from orchestrator.core.inventory import load_inventory
from orchestrator.evaluation.report import write_report
from orchestrator.evaluation.runs import new_run, write_json_atomic
from orchestrator.jobs.operation import job_status, launch_job
from orchestrator.transport import Connector
from orchestrator.watch import series as series_state

HOST = "ct129"
# Sequences rich itself never writes, so any of them in the output came from the host.
HOST_CONTROLS = ("\x1b]52;c;ZXZpbA==\x07", "\x1b]8;;http://evil.example/\x1b\\", "\x1b]0;pwned\x07", "\x1b[5n",
                 "\x1b[3J", "\x9b2J", "\x08\x7f", "\rFORGED")
EVIL = "".join(HOST_CONTROLS)
MARKUP = "[/x][conceal]hidden[/conceal][link=http://evil.example/]here[/link]"
SHOWN_MARKUP = ("[/x]", "[conceal]hidden[/conceal]", "[link=http://evil.example/]here[/link]")
HTML = '<img src="http://tracker.example/p.gif"> [click](http://evil.example/) a|b'
NAME = f"ev{EVIL}il{MARKUP}\ud800"  # a drafter name; the lone surrogate comes from a JSON "\ud800" escape
MD_NAME = f"ev{EVIL}il {HTML} `tick`"  # a drafter name for the Markdown tests
# rich's own output on a terminal: colours; for live bars also hide/show cursor, cursor up, erase line, CR.
RICH_SGR = re.compile(r"\x1b\[[0-9;]*m")
RICH_LIVE = re.compile(r"\x1b\[\?25[lh]|\x1b\[\d*A|\x1b\[2K|\r")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def leftover_controls(out: str, live: bool = False) -> list[str]:
    """Control characters in OUT once rich's own sequences are taken out (newline and tab are text)."""
    rest = RICH_SGR.sub("", out)
    rest = RICH_LIVE.sub("", rest) if live else rest
    return CONTROL.findall(rest.replace("\n", "").replace("\t", ""))


def cli(*args, terminal: bool = False, **kw):
    """dfo ARGS as on a terminal (rich writes colours) or into a pipe, wide enough that cells do not wrap."""
    env = {"COLUMNS": "400", "TTY_COMPATIBLE": "1" if terminal else "0", "TERM": "xterm-256color"}
    return dfo(*args, env=env, **kw)


def assert_terminal_safe(proc, live: bool = False) -> None:
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both and "MarkupError" not in both, proc.stderr[-3000:]
    for seq in HOST_CONTROLS:
        assert seq not in both, f"{seq!r} reached the terminal"
    assert leftover_controls(proc.stdout, live) == [] and leftover_controls(proc.stderr, live) == [], repr(both)


# ------------------------------------------------------------------------------------ the sanitiser


def test_clean_drops_every_control_character_but_newline_and_tab():
    every = "".join(chr(c) for c in range(0xA0)) + "\u202e\u2066\u2069" + "\ud800"
    out = clean(every + "end\r\nnext")
    assert out == "\t\n" + "".join(chr(c) for c in range(0x20, 0x7F)) + "\ufffdend\nnext"
    assert clean("50%\r100%") == "50%100%"  # a lone CR can no longer rewrite the line it is on
    assert clean(7) == "7" and clean("plain text: ünï €") == "plain text: ünï €"


def test_markdown_helpers_keep_host_text_inert():
    md = MarkdownIt("commonmark").enable("table")
    table = f"| a | b |\n|---|---|\n| {md_text('x|y')} | {md_code('p|q`', in_table=True)} |\n"
    html = md.render(f"- {md_text(MD_NAME)}\n\n{table}")
    assert "<img" not in html and "<a " not in html and "&lt;img" in html
    assert "<td>x|y</td>" in html and "<code>p|q`</code>" in html
    fence = md_fence("text\n```\n# heading?\n````\nstill inside", info="text")
    html = md.render("\n".join(fence) + "\n\nafter\n")
    assert html.count("<pre>") == 1 and "<h1>" not in html and "still inside" in html.split("</pre>")[0]
    assert md.render(md_code("a `` b")) == "<p><code>a `` b</code></p>\n"


def test_every_console_dfo_creates_is_the_one_that_strips_control_characters():
    root = Path(orchestrator.__file__).parent
    plain = [f"{path.relative_to(root)}:{number}" for path in sorted(root.rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bConsole\(", line)]
    assert plain == [], "create consoles with orchestrator.ui.safe_console.SafeConsole"


# ------------------------------------------------------------------------------------ run folders


def hostile_results(name: str) -> tuple[dict, list[dict]]:
    """results.json and samples.jsonl as a compromised eval host could write them (valid JSON, lying text)."""
    block = {"tau_macro": 3.0, "tau_micro": 3.25, "rounds": 20, "per_position": [{"k": 1, "p": 0.5}],
             "exact": True, "definition": f"defined {EVIL}{HTML}"}
    metrics = {"tau_macro": 3.0, "tau_micro": 3.1, "samples": 1, "rounds": 20,
               "per_position": [{"k": 1, "p": 0.5}, {"k": 2, "p": 0.25}], "tau_histogram": {"1": 3, "2": 5},
               "tree": {"topk": {"k": 8, "tau_macro": 3.5, "definition": f"top-k {HTML}"}},
               "definitions": {f"tau{HTML}": f"mean {EVIL}"},
               "conventions": {"committed": block, "vllm": block,
                               "zlab-2604": {"available": False, "reason": f"no tail {EVIL}{MARKUP}{HTML}"}}}
    results = {
        "settings": {"max_new_tokens": 64, "prompts": f"prompts {EVIL}{HTML}", "device": "cpu"},
        "target": {"path": f"/m/{EVIL}{HTML}"},
        "drafters": {name: {"metrics": metrics, "spec": {"format": f"zlab{HTML}"}, "timings": {"eval_s": 1.5},
                            "engine": {"error": f"engine down {EVIL}{MARKUP}{HTML}"}},
                     "plain": {"metrics": {**metrics, "conventions": {}}, "timings": {"eval_s": 2.5}}},
        "comparison": {"confidence": 0.95, "pairs": [{"a": "plain", "b": name, "samples": 1,
                                                      "tau_macro": {"delta": 0.5, "ci": [0.1, 0.9]},
                                                      "verdict": f"better {EVIL}{MARKUP}"}]},
        "warnings": [f"warned {EVIL}{MARKUP}\n{HTML}"],
        "diagnostics": {"text": f"diag {EVIL}\n```\n<img src=x>\n# not a heading\n````\nlast line of the diag"},
    }
    samples = [{"id": f"s1{HTML}", "host": HOST, "continuation_tokens": 10,
                "drafters": {name: {"tau": 3.0}, "plain": {"tau": 2.0}}}]
    return results, samples


def hostile_run(root: Path, name: str = NAME, results: dict | None = None):
    default, samples = hostile_results(name)
    run = new_run(root, [HOST], {"request": {}})
    (run.path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    write_json_atomic(run.results_path, results if results is not None else default)
    run.set(status="succeeded")
    return run


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_runs_show_and_list_print_host_text_as_text(tmp_path, terminal):
    run = hostile_run(tmp_path)
    for args in (("runs", "show", run.name), ("runs", "list")):
        proc = cli(*args, runs=tmp_path, terminal=terminal)
        assert proc.returncode == 0, proc.stderr
        assert_terminal_safe(proc)
        assert "FORGED" in proc.stdout and "]52;c;ZXZpbA==" in proc.stdout  # the payloads are shown, inert
        for shown in SHOWN_MARKUP:
            assert shown in proc.stdout, (args, shown)  # markup in a name is printed, not applied
    shown = cli("runs", "show", run.name, runs=tmp_path, terminal=terminal).stdout
    assert "τ unavailable: no tail" in shown and "better ]52" in shown and "engine down ]52" in shown


def test_a_failed_runs_error_is_printed_as_text(tmp_path):
    run = new_run(tmp_path, [HOST], {"request": {}})
    run.set(status="failed", error=f"{HOST}: eval failed on the host: {EVIL}{MARKUP}")
    proc = cli("runs", "show", run.name, runs=tmp_path, terminal=True)
    assert proc.returncode == 1
    assert_terminal_safe(proc)
    assert all(shown in proc.stdout for shown in SHOWN_MARKUP)


def md_cells(row: str) -> list[str]:
    """The cells of a Markdown table row, split on the '|'s that are not backslash-escaped."""
    cells, cell, i = [], "", 0
    while i < len(row):
        if row[i] == "\\" and i + 1 < len(row):
            cell, i = cell + row[i:i + 2], i + 2
            continue
        if row[i] == "|":
            cells.append(cell)
            cell = ""
        else:
            cell += row[i]
        i += 1
    return [c.strip() for c in cells[1:]]


def table_blocks(md: str) -> list[list[str]]:
    blocks, current = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    return blocks


def assert_markdown_inert(md: str, own_images: set[str]) -> str:
    """Every table row has its header's cell count; the rendered page has no host HTML, link or image."""
    for block in table_blocks(md):
        width = len(md_cells(block[0]))
        assert all(len(md_cells(row)) == width for row in block), "\n".join(block)
    html = MarkdownIt("commonmark").enable("table").render(md)
    assert set(re.findall(r'<img src="([^"]*)"', html)) <= own_images, html
    assert "<a " not in html and "tracker.example/p.gif\"" not in html
    assert CONTROL.findall(md.replace("\n", "").replace("\t", "")) == []
    return html


def test_report_md_escapes_host_text(tmp_path):
    results, samples = hostile_results(MD_NAME)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    md = write_report(run_dir, results, samples).read_text(encoding="utf-8")
    html = assert_markdown_inert(md, {"acceptance.png", "tau_histogram.png"})
    acceptance = next(b for b in table_blocks(md) if "| drafter | format |" in b[0])
    row = md_cells(next(r for r in acceptance if r.startswith("| ev")))
    assert row[-1] == "1.5" and row[1].startswith("zlab")  # no cell was added or shifted by the name
    assert "&lt;img src=" in html and "a|b" in html and "[click](http://evil.example/)" in html
    # The diagnostics stay in one code block: the host's ``` and ```` do not end it early.
    diag = html.split("Diagnostics</h2>")[1]
    assert diag.index("last line of the diag") < diag.index("</pre>") and "<h1>" not in diag


def test_malformed_figures_show_as_question_marks_not_tracebacks(tmp_path):
    results, samples = hostile_results("d")
    m = results["drafters"]["d"]["metrics"]
    m.update(tau_macro="3.0", tau_micro={"x": 1}, rounds=[20], samples="ten",
             per_position=[{"k": "1", "p": 0.5}, 5, {"k": 2, "p": "high"}, {"k": [3], "p": 0.1}],
             tau_histogram={"x": 1, "2": "y", "3": {}, "²": 4, "4": 2},
             tree={"topk": {"k": "<b>8</b>", "tau_macro": [3.5]}, "budgeted": {"budget": {"b": 1}, "tau_macro": 1}})
    m["conventions"]["zlab-2604"] = {"available": False, "reason": ["not", "text"]}
    m["conventions"]["vllm"] = "not an object"
    results["drafters"]["d"]["timings"] = {"eval_s": 10**400}
    results["drafters"]["d"]["engine"] = "not an object"
    results["drafters"]["x"] = ["not", "an", "object"]
    results["comparison"] = {"confidence": "95%", "pairs": [{"a": 1, "samples": {}, "verdict": 3,
                                                             "tau_macro": {"delta": "big", "ci": "wide"}}, "junk"]}
    results["warnings"] = "one string, not a list"
    results["diagnostics"] = {"text": {"not": "text"}}
    samples[0]["drafters"] = ["not", "an", "object"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    md = write_report(run_dir, results, samples).read_text(encoding="utf-8")
    row = md_cells(next(r for r in md.splitlines() if r.startswith("| d |")))
    assert row[2:4] == ["?", "?"] and row[-3:] == ["?", "?", "?"]  # τ macro/micro; samples, rounds, eval s
    assert "DDTree-8" in md and "<b>" not in md and "one string, not a list" in md
    run = hostile_run(tmp_path / "runs", "d", results)
    for args in (("runs", "show", run.name), ("runs", "list")):
        proc = cli(*args, runs=tmp_path / "runs")
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr and " ? " in proc.stdout


@pytest.mark.parametrize("broken,says", [("{not json", "not valid JSON"), ("[1, 2]", "not a JSON object")])
def test_a_damaged_results_file_is_a_clear_error(tmp_path, broken, says):
    run = hostile_run(tmp_path, "d")
    run.results_path.write_text(broken)
    proc = cli("runs", "show", run.name, runs=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "results.json" in proc.stderr and says in proc.stderr
    listed = cli("runs", "list", runs=tmp_path)
    assert listed.returncode == 0 and run.name in listed.stdout


# ------------------------------------------------------------------------------------ series


def hostile_series(runs: Path) -> str:
    """A series whose checkpoint names (the training host's) and errors (the eval host's) lie."""
    name = "s1"
    doc = series_state.new_series(name, source="kpro6:/ckpts", eval_host=HOST,
                                  settings={"target": "/m/t`x`", "samples": 8, "prompts": "builtin",
                                            "max_new_tokens": 64, "dtype": "float32"})
    stat = {"value": 3.0, "ci": [2.5, 3.5]}
    measures = {"tau_macro": stat, "tau_micro": stat, "ddtree": {**stat, "k": 8},
                "p": [{"k": k, "value": 0.5, "ci": [0.4, 0.6]} for k in range(1, 5)]}
    doc["checkpoints"] = {
        f"step_1{EVIL}{MARKUP}{HTML}": {"name": f"step_1{EVIL}{MARKUP}{HTML}", "step": 1, "status": "done",
                                         "run": "r1|x`", "measures": measures, "verdict": {"verdict": "first"}},
        "step_2.pt": {"name": "step_2.pt", "step": 2, "status": "failed", "run": None,
                      "error": f"eval: {HOST}: failed {EVIL}{MARKUP}\n{HTML}"},
        f"step_3{EVIL}": {"name": f"step_3{EVIL}", "step": 3, "status": "evaluating", "run": "r3"},
    }
    doc["baselines"] = {"key": "k", "run": "rb", "drafters": {f"base$\\nosuchcmd${EVIL}{MARKUP}{HTML}": measures}}
    series_state.save(series_state.series_dir(runs, name), doc)
    return name


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_series_show_list_and_plot_keep_host_text_inert(tmp_path, terminal):
    name = hostile_series(tmp_path)
    for args in (("series", "show", name), ("series", "list"), ("series", "plot", name)):
        proc = cli(*args, runs=tmp_path, terminal=terminal)
        assert proc.returncode == 0, proc.stderr
        assert_terminal_safe(proc)
    shown = cli("series", "show", name, runs=tmp_path, terminal=terminal).stdout
    assert all(s in shown for s in SHOWN_MARKUP) and "failed ]52;c;ZXZpbA==" in shown
    md = (series_state.series_dir(tmp_path, name) / "series.md").read_text(encoding="utf-8")
    assert_markdown_inert(md, {"tau_vs_step.png"})
    checkpoints = next(b for b in table_blocks(md) if "| step | checkpoint |" in b[0])
    assert [md_cells(r)[0] for r in checkpoints[2:]] == ["1", "2", "3"] and len(checkpoints) == 5
    assert md_cells(checkpoints[2])[-1] == "`` r1\\|x` ``"  # the run name stays one code span in its cell


# ------------------------------------------------------------------------------------ real hosts

JOB_SCRIPT = r"""
import json, sys
evil = json.loads(sys.argv[1])
print("plain line " + evil)
for rec in ({"dfo": "progress", "stage": "gen" + evil, "done": 1, "total": 2, "unit": "tok" + evil,
             "message": evil},
            {"dfo": "progress", "stage": "gen" + evil, "unit": 5, "message": {"a": 1}, "done": "x"},
            {"dfo": "warning", "message": "careful " + evil, "stage": "[/x]"},
            {"dfo": "stage", "stage": "load" + evil, "status": "done", "message": evil}):
    print(json.dumps(rec))
print("last line " + evil, flush=True)
sys.exit(3)
"""


@pytest.fixture
def hostile_job(sandbox):
    """A finished job on ct129 whose log is full of terminal sequences and markup; exit 3 (failed)."""
    inv = load_inventory(sandbox.inventory_path)
    with Connector(inv) as conn:
        handle = launch_job(conn, HOST, [inv.hosts[HOST].python, "-c", JOB_SCRIPT, json.dumps(EVIL + MARKUP)],
                            job_name=f"named{EVIL}{MARKUP}", lock=None)
        wait_for(lambda: job_status(conn, HOST, handle.job_id).done, "the job to finish")
    return handle


@pytest.mark.sshd
@pytest.mark.parametrize("args,terminal,live", [
    (("jobs", "status"), True, False), (("jobs", "logs"), True, False), (("jobs", "logs"), False, False),
    (("jobs", "logs", "-f"), True, True), (("jobs", "list", "-H", HOST), True, False),
])
def test_a_jobs_log_cannot_write_to_the_terminal(sandbox, hostile_job, args, terminal, live):
    ref = [] if "list" in args else [f"{HOST}:{hostile_job.job_id}"]
    proc = cli(sandbox, *args[:2], *ref, *args[2:], terminal=terminal)
    assert proc.returncode in (0, 1), proc.stderr
    assert_terminal_safe(proc, live=live)
    if "list" in args:
        assert "named]52;c;ZXZpbA==" in proc.stdout
    else:
        assert "last line ]52;c;ZXZpbA==" in proc.stdout and "[conceal]hidden[/conceal]" in proc.stdout


@pytest.mark.sshd
def test_a_host_error_message_cannot_write_to_the_terminal(sandbox, hostile_job, tmp_path):
    host = HostileHost(sandbox, HOST, tmp_path / "hostile")
    host.tamper(f"def tamper(func, reply):\n    return {{'error': {EVIL + MARKUP!r}}} if func == 'status' else reply\n")
    proc = cli("jobs", "status", f"{HOST}:{hostile_job.job_id}", terminal=True, inventory=host.inventory)
    assert "status" in host.called()
    assert proc.returncode == 1
    assert_terminal_safe(proc)
    assert "error:" in proc.stderr and "jobs.status: ]52;c;ZXZpbA==" in proc.stderr
    assert all(shown in proc.stderr for shown in SHOWN_MARKUP)


@pytest.mark.sshd
def test_runs_pull_of_hostile_results_writes_an_inert_report_and_terminal(sandbox, tmp_path):
    results, samples = hostile_results(MD_NAME + MARKUP)
    script = ("import json, os, sys\nout = os.environ['DFO_RESULTS_DIR']\nres, smp = json.loads(sys.argv[1])\n"
              "open(out + '/results.json', 'w').write(json.dumps(res))\n"
              "open(out + '/samples.jsonl', 'w').write(''.join(json.dumps(s) + '\\n' for s in smp))\n")
    inv = load_inventory(sandbox.inventory_path)
    with Connector(inv) as conn:
        handle = launch_job(conn, HOST, [inv.hosts[HOST].python, "-c", script, json.dumps([results, samples])],
                            lock=None)
        st = wait_for(lambda: (status := job_status(conn, HOST, handle.job_id)).done and status, "the job to finish")
        assert st.ok, st.log_tail
    runs = tmp_path / "runs"
    run = runs / "20260101-000000-ct129-abcd"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run": run.name, "status": "running", "hosts": [HOST],
                                              "jobs": {HOST: {"job_id": handle.job_id, "job_dir": handle.job_dir}}}))
    proc = cli(sandbox, "runs", "pull", run.name, runs=runs, terminal=True)
    assert proc.returncode == 0, proc.stderr
    assert_terminal_safe(proc, live=True)  # the pull's transfer bars are rich's live display
    assert all(shown in proc.stdout for shown in SHOWN_MARKUP)
    assert_markdown_inert((run / "report.md").read_text(encoding="utf-8"), {"acceptance.png", "tau_histogram.png"})
