# Host side of dfo's Slurm clusters (orchestrator/cluster/): runs on the cluster's login node with its own
# Python, behind transport/host_prelude.py (see transport/hostcall.py). Stdlib only, Python >= 3.8.
#
# It runs Slurm's commands (sbatch, squeue, scontrol, sacct, scancel, sinfo) as argv lists, never through a
# shell, and hands their answers back as bounded text: the controller types every answer (cluster/replies.py)
# and decides everything. The batch script is rendered here too (batch_script_text), from values the
# controller validated (cluster/plan.py); the controller renders it with this same function for --dry-run.
import os
import re
import shlex
import subprocess

MAX_TEXT = 1 << 20  # bytes of a command's stdout handed back
RECORD_BYTES = 512  # a task's started.json / finished.json is a one-line JSON object
# \Z, not $: "$" also matches before a trailing newline, and "123\n" is no job id.
DIGITS = re.compile(r"^[0-9]{1,12}\Z")
TARGET = re.compile(r"^[0-9]{1,12}(_[0-9]{1,4})?\Z")
SACCT_FIELDS = "JobID,JobIDRaw,State,ExitCode,NodeList"


def _run(argv, stdin=None, timeout=120):
    """[exit code, stdout, stderr tail] of ARGV (127: not installed, 124: timed out)."""
    try:
        done = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except FileNotFoundError:
        return [127, "", "%s: command not found" % argv[0]]
    except subprocess.TimeoutExpired:
        return [124, "", "%s did not answer within %d s" % (argv[0], timeout)]
    return [done.returncode, done.stdout[:MAX_TEXT].decode("utf-8", "replace"),
            done.stderr[-4000:].decode("utf-8", "replace")]


def _job_id(value, what="job id"):
    if not isinstance(value, str) or not DIGITS.match(value):
        raise RuntimeError("%s must be digits, got %r" % (what, str(value)[:40]))
    return value


# ----------------------------------------------------------------------------------------- batch script


def _with_placeholders(arg):
    """ARG quoted for bash, with {task} and {task_dir} left to expand from the task's variables."""
    out = []
    for piece in re.split(r"(\{task\}|\{task_dir\})", arg):
        if piece == "{task}":
            out.append('"$task"')
        elif piece == "{task_dir}":
            out.append('"$task_dir"')
        elif piece:
            out.append(shlex.quote(piece))
    return "".join(out) or "''"


def batch_script_text(name, array, job_dir, options, command, env, cwd):
    """The batch script of one array job. Array task i works in JOB_DIR/tasks/i: it writes started.json
    (job id, task, node, start time) first and finished.json (exit status) last, each through a temporary
    name and a rename, so a task killed by the scheduler leaves no finished record."""
    lines = ["#!/bin/bash", "#SBATCH --job-name=%s" % name, "#SBATCH --array=%s" % array,
             "#SBATCH --output=%s/tasks/%%a/slurm.log" % job_dir, "#SBATCH --chdir=%s" % job_dir]
    lines += ["#SBATCH %s" % option for option in options]
    lines += [
        "set -u",
        "job_dir=%s" % shlex.quote(job_dir),
        'task="${SLURM_ARRAY_TASK_ID:?not an array task}"',
        'task_dir="$job_dir/tasks/$task"',
        'mkdir -p "$task_dir" && rm -f "$task_dir/finished.json"',
    ]
    lines += ["export %s=%s" % (key, shlex.quote(value)) for key, value in sorted(env.items())]
    lines += [
        # The task's own record: which job, which node, when (the controller cross-checks it with Slurm's).
        'printf \'{"job_id": "%s", "array_job_id": "%s", "task": %d, "node": "%s", "started": %s}\\n\' '
        '"${SLURM_JOB_ID}" "${SLURM_ARRAY_JOB_ID}" "$task" "${SLURMD_NODENAME:-unknown}" "$(date +%s.%N)" '
        '> "$task_dir/.started.json.tmp" && mv "$task_dir/.started.json.tmp" "$task_dir/started.json"',
        ("cd %s || exit 1" % shlex.quote(cwd)) if cwd else 'cd "$task_dir" || exit 1',
        " ".join(_with_placeholders(arg) for arg in command),
        "status=$?",
        'printf \'{"exit_code": %d, "finished": %s}\\n\' "$status" "$(date +%s.%N)" '
        '> "$task_dir/.finished.json.tmp" && mv "$task_dir/.finished.json.tmp" "$task_dir/finished.json"',
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- jobs


def submit(spec, folders, keep_as):
    """Create the task FOLDERS, keep the script as KEEP_AS (beside them), submit it with sbatch --parsable."""
    script = batch_script_text(**spec)
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
    # A fresh file (never through a link someone planted): the script stays beside the tasks for the record.
    fd = os.open(keep_as, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(script)
    return _run(["sbatch", "--parsable"], stdin=script.encode())


def states(array_job_id):
    """squeue's and scontrol's answers about the array: {"squeue": [rc, out, err], "scontrol": [...]}."""
    _job_id(array_job_id)
    return {"squeue": _run(["squeue", "-h", "-r", "-j", array_job_id, "-o", "%i|%A|%K|%F|%T|%r|%N"]),
            "scontrol": _run(["scontrol", "show", "job", array_job_id, "--oneliner"])}


def accounted(array_job_id, job_ids):
    """sacct's records of an array Slurm's controller has forgotten (it ended longer ago than MinJobAge).
    Accounting first (its JobID is ARRAY_TASK); where accounting is off, the job completion log (sacct -c),
    which knows each task by its own job id only (JOB_IDS, as the tasks' started.json recorded them)."""
    _job_id(array_job_id)
    base = ["sacct", "-X", "-n", "-P", "-o", SACCT_FIELDS]
    code, out, err = _run(base + ["-j", array_job_id])
    if code == 0 and out.strip():
        return {"source": "accounting", "text": out}
    ids = [_job_id(value) for value in job_ids][:1000]
    if ids:
        code, out, err = _run(base + ["-c", "-j", ",".join(ids)])
        if code == 0:
            return {"source": "completion", "text": out}
    return {"source": None, "text": "", "error": err.strip()[-300:]}


def cancel(target):
    """scancel ARRAY or ARRAY_TASK."""
    if not isinstance(target, str) or not TARGET.match(target):
        raise RuntimeError("scancel target must be JOBID or JOBID_TASK, got %r" % str(target)[:40])
    return _run(["scancel", target])


def _head(path):
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as fh:
        return fh.read(RECORD_BYTES).decode("utf-8", "replace")


def records(job_dir, tasks):
    """Each task's started.json and finished.json as text ("" when absent), at most 512 bytes each."""
    out = {}
    for task in tasks:
        folder = os.path.join(job_dir, "tasks", str(int(task)))
        out[str(int(task))] = {name: _head(os.path.join(folder, name + ".json")) for name in ("started", "finished")}
    return out


def find_array(jobs_root, array_job_id, limit=2000):
    """The task folders under JOBS_ROOT (<shared>/dfo-jobs) whose started.json names ARRAY_JOB_ID:
    [[job folder, task, started.json text], ...] (read only; the controller checks each)."""
    _job_id(array_job_id)
    found, seen = [], 0  # type: list, int
    needle = '"array_job_id": "%s"' % array_job_id
    try:
        jobs = sorted(os.listdir(jobs_root))
    except OSError:
        return []
    for job in jobs:
        tasks_dir = os.path.join(jobs_root, job, "tasks")
        try:
            tasks = sorted(os.listdir(tasks_dir))
        except OSError:
            continue
        for task in tasks:
            seen += 1
            if seen > limit:
                return found
            text = _head(os.path.join(tasks_dir, task, "started.json"))
            if task.isdigit() and needle in text:
                found.append([os.path.join(jobs_root, job), int(task), text])
    return found


# ----------------------------------------------------------------------------------------- check --connect


def probe(partition, options, shared, token, wait_s):
    """sbatch's version, the partition's availability and generic resources per node (GPUs), and (when it
    is up and TOKEN is given) whether a one-minute job on a compute node can write TOKEN into SHARED where this
    node reads it back."""
    where = ["-p", partition] if partition else []
    facts = {"version": _run(["sbatch", "--version"]), "sinfo": _run(["sinfo", "-h", "-o", "%a"] + where),
             "gres": _run(["sinfo", "-h", "-o", "%G"] + where), "job": None, "seen": None}
    if not token or facts["version"][0] != 0:
        return facts
    states = set(line.strip() for line in facts["sinfo"][1].splitlines() if line.strip())
    if states != {"up"}:
        return facts
    if not re.match(r"^[0-9a-f]{16}\Z", token):
        raise RuntimeError("probe token must be 16 hex digits")
    path = os.path.join(shared, ".dfo-probe-" + token)
    facts["job"] = _run(["sbatch", "--wait", "--quiet", "--job-name=dfo-probe", "--time=1", "--output=/dev/null"]
                        + list(options) + ["--wrap=echo %s > %s" % (token, shlex.quote(path))],
                        timeout=int(wait_s))
    facts["seen"] = _head(path).strip()
    try:
        os.unlink(path)
    except OSError:
        pass
    return facts
