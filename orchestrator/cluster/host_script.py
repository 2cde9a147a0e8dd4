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
import stat
import subprocess
import time

MAX_TEXT = 1 << 20  # bytes of a command's stdout handed back
RECORD_BYTES = 512  # a task's started.json / finished.json is a one-line JSON object
WAIT_MAX_S = 30.0  # the longest one wait_records call holds the login session (follow's longest interval)
WAIT_STEP_S = 0.25  # how often it looks at the task folders (local stat calls, no Slurm command)
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


def _owner_check(path, st, private):
    """Refuse PATH (its lstat ST) unless it is a real folder of this user's: PRIVATE, with no access for group or
    others; else (the folder holding the jobs root) at least not writable by anyone else unless sticky."""
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeError("%s is not a folder (a link or a file is never followed): dfo refuses to use it" % path)
    mode = stat.S_IMODE(st.st_mode)
    if private and (st.st_uid != os.getuid() or mode & 0o077):
        raise RuntimeError("%s belongs to uid %d with mode %04o: a cluster job folder must be this user's (uid %d) "
                           "with mode 0700, or another user could forge or redirect its records; dfo refuses to use "
                           "it" % (path, st.st_uid, mode, os.getuid()))
    if not private and (st.st_uid not in (os.getuid(), 0) or (mode & 0o022 and not mode & stat.S_ISVTX)):
        raise RuntimeError("%s (uid %d, mode %04o) can be written by another user, who could swap the job folders "
                           "inside it: dfo refuses it (chmod go-w it, or give the host a workdir of your own)"
                           % (path, st.st_uid, mode))


def _checked(path, private=True):
    """PATH (lstat: never through a link), owner and mode checked (``_owner_check``)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise RuntimeError("%s: %s" % (path, exc.strerror or exc)) from None
    _owner_check(path, st, private)
    return path


def _private_folder(path, fresh):
    """PATH as a private folder: FRESH, created now (mode 0700, exclusively: an existing one is never reused);
    else created 0700 when missing or, existing, checked to be this user's and private."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if fresh:
            raise RuntimeError("%s exists already: a cluster job folder is never reused (dfo names each job's "
                               "folder after its run; another user, or an earlier job, made this one)" % path) from None
    return _checked(path)


def _jobs_root(job_dir):
    """JOB_DIR's parent (the jobs root, <workdir>/slurm-jobs): the folder above it not writable by others,
    the root itself private (created 0700 when missing)."""
    root = os.path.dirname(job_dir)
    _checked(os.path.dirname(root), private=False)
    return _private_folder(root, fresh=False)


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
    """The batch script of one array job. Array task i works in JOB_DIR/tasks/i (made 0700 by ``submit``, and
    checked again here: a real folder of this user's, no access for others): it writes started.json (job id,
    task, node, start time) first and finished.json (exit status) last, each through a temporary name created
    exclusively (noclobber: never through a planted link) and a rename, so a task killed by the scheduler
    leaves no finished record."""
    lines = ["#!/bin/bash", "#SBATCH --job-name=%s" % name, "#SBATCH --array=%s" % array,
             "#SBATCH --output=%s/tasks/%%a/slurm.log" % job_dir, "#SBATCH --chdir=%s" % job_dir]
    lines += ["#SBATCH %s" % option for option in options]
    lines += [
        "set -u",
        "job_dir=%s" % shlex.quote(job_dir),
        'task="${SLURM_ARRAY_TASK_ID:?not an array task}"',
        'task_dir="$job_dir/tasks/$task"',
        # The folder submit made: this user's, a real folder, no access for group or others; else nothing runs.
        'if [ ! -d "$task_dir" ] || [ -L "$task_dir" ] || [ ! -O "$task_dir" ] '
        '|| [ "$(stat -c %a "$task_dir")" != 700 ]; then',
        '  echo "dfo: $task_dir is not a private folder of this user (mode 0700): refusing to run" >&2; exit 97',
        'fi',
        'set -o noclobber',  # `>` creates the records' temporary names exclusively
        'rm -f "$task_dir/finished.json" "$task_dir/.started.json.tmp" "$task_dir/.finished.json.tmp"',
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


def submit(spec, folders, keep_as, resume=False):
    """Create the job's folder (exclusively: never one that exists, unless RESUME submits its missing tasks
    again) and its task FOLDERS, each 0700 and checked; keep the script as KEEP_AS (beside them); submit it with
    sbatch --parsable."""
    script = batch_script_text(**spec)
    job_dir = spec["job_dir"]
    _jobs_root(job_dir)
    _private_folder(job_dir, fresh=not resume)
    _private_folder(os.path.join(job_dir, "tasks"), fresh=False)
    for folder in folders:
        if os.path.dirname(folder) != os.path.join(job_dir, "tasks"):
            raise RuntimeError("task folder %r is not inside %s/tasks" % (folder, job_dir))
        _private_folder(folder, fresh=False)
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
    """The first RECORD_BYTES of the regular file PATH ("" when absent, a link, or not a regular file: opened
    non-blocking, so a FIFO planted there cannot hang the reader, and checked with fstat before any read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return ""
        return fh.read(RECORD_BYTES).decode("utf-8", "replace")


def records(job_dir, tasks):
    """Each task's started.json and finished.json as text ("" when absent), at most 512 bytes each; the job's
    folders checked first (this user's, private: records another user could write are never read)."""
    _checked(job_dir)
    out = {}
    for task in tasks:
        folder = os.path.join(job_dir, "tasks", str(int(task)))
        texts = {"started": "", "finished": ""}
        if os.path.lexists(folder):
            _checked(os.path.join(job_dir, "tasks"))
            _checked(folder)
            texts = {name: _head(os.path.join(folder, name + ".json")) for name in texts}
        out[str(int(task))] = texts
    return out


def wait_records(job_dir, tasks, seen, wait_s):
    """records(JOB_DIR, TASKS) as soon as a task has a record SEEN (task -> the record names the controller has
    seen) does not list, or after WAIT_S seconds (at most WAIT_MAX_S). Looking at the task folders costs the
    scheduler nothing, so the controller learns that a task ended when it ends and asks squeue only then or
    when its own interval is up."""
    deadline = time.time() + min(max(float(wait_s), 0.0), WAIT_MAX_S)
    known = {str(task): set(names) for task, names in dict(seen).items()}
    while True:
        found = records(job_dir, tasks)
        new = any(text and name not in known.get(task, ()) for task, texts in found.items()
                  for name, text in texts.items())
        if new or time.time() >= deadline:
            return found
        time.sleep(WAIT_STEP_S)


def task_results(job_dir, task, limit=1000):
    """sha256 and size of each regular file of task TASK's results folder and its engine/ folder (what a pull
    must reproduce), the job's folders checked first; links and anything else are left out."""
    folder = os.path.join(_checked(job_dir), "tasks", str(int(task)))
    _checked(os.path.join(job_dir, "tasks"))
    _checked(folder)
    files = {}  # type: dict
    for sub in ("", "engine"):
        where = os.path.join(folder, "results", sub) if sub else os.path.join(folder, "results")
        try:
            names = sorted(os.listdir(where))[:limit]
        except OSError:
            continue
        for name in names:
            path = os.path.join(where, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and len(files) < limit:
                files[sub + "/" + name if sub else name] = {"sha256": _sha256(path), "size": st.st_size}
    return files


def find_array(jobs_root, array_job_id, limit=2000):
    """The task folders under JOBS_ROOT (<workdir>/slurm-jobs) whose started.json names ARRAY_JOB_ID:
    [[job folder, task, started.json text], ...] (read only; the controller checks each). The root and every
    folder read must be this user's and private; one that is not is skipped (the root itself: refused)."""
    _job_id(array_job_id)
    found, seen = [], 0  # type: list, int
    needle = '"array_job_id": "%s"' % array_job_id
    if not os.path.lexists(jobs_root):
        return []
    _checked(jobs_root)
    try:
        jobs = sorted(os.listdir(jobs_root))[:limit]
    except OSError:
        return []
    for job in jobs:
        tasks_dir = os.path.join(jobs_root, job, "tasks")
        try:
            _checked(os.path.join(jobs_root, job))
            _checked(tasks_dir)
            tasks = sorted(os.listdir(tasks_dir))[:limit]
        except (OSError, RuntimeError):
            continue
        for task in tasks:
            seen += 1
            if seen > limit:
                return found
            if not task.isdigit():
                continue
            try:
                _checked(os.path.join(tasks_dir, task))
            except RuntimeError:
                continue
            text = _head(os.path.join(tasks_dir, task, "started.json"))
            if needle in text:
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
