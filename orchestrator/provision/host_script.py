# Host side of `dfo provision`: facts for the plan, uv and wheel uploads, venv creation, sync, marker.
#
# Runs with the host's own interpreter (stdlib only, Python >= 3.8). Expected failures (uv refusing a
# requirement, a missing interpreter, no space left) come back as {"ok": False, "step", "command",
# "message"} with uv's own words, so the controller can name the host and the step.
#
# Layout under WORKDIR:  tools/uv-<version>/uv    uv pushed by dfo (when the host has no usable uv)
#                        wheelhouse/               pushed wheels (a flat pool, every file hash-checked)
#                        provision/<sha>.lock      the lock last synced (what the marker refers to)
#                        cache/uv                  uv's cache (same filesystem as the venv: hardlinks)
# and in the venv:       .dfo-provision.json       the marker, written only after a verified sync
import json
import os
import shutil
import socket
import subprocess
import time
import uuid

MARKER = ".dfo-provision.json"

# Printed by the interpreter a venv is (or will be) built with: what wheels and markers must match.
PYTHON_FACTS = r"""
import json, os, platform, sys, sysconfig
def fmt(info):
    s = "%d.%d.%d" % (info.major, info.minor, info.micro)
    if info.releaselevel != "final":
        s += info.releaselevel[0] + str(info.serial)
    return s
try:
    libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
except (AttributeError, ValueError, OSError):
    libc = ""
impl = {"cpython": "cp", "pypy": "pp"}.get(sys.implementation.name, sys.implementation.name)
abi = "%s%d%d" % (impl, sys.version_info[0], sys.version_info[1])
if sysconfig.get_config_var("Py_GIL_DISABLED"):
    abi += "t"
print(json.dumps({
    "executable": sys.executable,
    "version": platform.python_version(),
    "implementation": impl,
    "abi": abi,
    "machine": platform.machine(),
    "glibc": libc.split()[1] if libc.startswith("glibc ") else None,
    "markers": {
        "implementation_name": sys.implementation.name,
        "implementation_version": fmt(sys.implementation.version),
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    },
}))
"""

# Versions of the packages that decide which kernels run (read from metadata: no torch import, fast).
REPORTED = ["torch", "transformers", "accelerate", "safetensors", "tokenizers", "numpy", "triton",
            "flash-linear-attention", "fla-core"]
PACKAGE_FACTS = r"""
import json, sys
from importlib import metadata
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""




def _tail(text, lines=25):
    return "\n".join(text.strip().splitlines()[-lines:])


def _run(argv, env=None, timeout=None, cwd=None):
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=full_env, timeout=timeout, cwd=cwd)
    except FileNotFoundError as exc:
        return 127, "", str(exc)
    except PermissionError as exc:
        return 126, "", str(exc)
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after %ss: %s" % (timeout, " ".join(argv))
    return proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")


def python_facts(python):
    resolved = shutil.which(python) if "/" not in python else (python if os.path.exists(python) else None)
    if not resolved:
        return {"found": False, "error": "no interpreter %r on PATH (%s)" % (python, os.environ.get("PATH", ""))}
    code, out, err = _run([resolved, "-c", PYTHON_FACTS], timeout=60)
    if code != 0:
        return {"found": False, "error": _tail(err or out, 5) or "exit %d" % code}
    facts = json.loads(out)
    facts["found"] = True
    facts["path"] = resolved
    return facts


def interpreter_facts(name):
    """python_facts for another interpreter (an engine lock's Python, e.g. python3.11)."""
    return python_facts(name)


def _uv_version(path):
    code, out, err = _run([path, "--version"], timeout=30)
    if code != 0:
        return None
    parts = out.split()
    return parts[1] if len(parts) >= 2 and parts[0] == "uv" else None




def probe(workdir, venv, interpreter, dfo_uv, detect_gpu):
    """Everything the plan needs, in one round trip (the no-op path stays fast)."""
    home = os.path.expanduser("~")
    candidates = []
    if os.path.isfile(dfo_uv) and os.access(dfo_uv, os.X_OK):
        candidates.append(("dfo", dfo_uv))
    on_path = shutil.which("uv")
    for path in (on_path, os.path.join(home, ".local", "bin", "uv"), os.path.join(home, ".cargo", "bin", "uv")):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            if all(os.path.realpath(path) != os.path.realpath(p) for _, p in candidates):
                candidates.append(("host", path))
    uvs = [{"source": src, "path": p, "version": _uv_version(p)} for src, p in candidates]
    gpu = None
    if detect_gpu:
        smi = shutil.which("nvidia-smi")
        if smi:
            code, out, _ = _run([smi, "-L"], timeout=20)
            gpu = {"found": code == 0 and "GPU" in out, "lines": out.strip().splitlines()[:16]}
        else:
            gpu = {"found": False, "lines": []}
    venv_python = os.path.join(venv, "bin", "python")
    return {
        "python": python_facts(interpreter),
        "uv": uvs,
        "venv": {
            "exists": os.path.isdir(venv),
            "python": os.path.exists(venv_python),
            "marker": _read_json(os.path.join(venv, MARKER)),
        },
        "gpu": gpu,
        "tar": shutil.which("tar") is not None,
        "free_bytes": _free_bytes(workdir),
        "free_bytes_venv": _free_bytes(venv),
        "https_proxy": bool(os.environ.get("https_proxy") or os.environ.get("HTTPS_PROXY")),
    }


def reachable(targets, timeout=3.0):
    """Can this host open TCP connections to the package index hosts? {host: true/false}."""
    out = {}
    for target in targets:
        try:
            socket.create_connection((target, 443), timeout=timeout).close()
            out[target] = True
        except OSError:
            out[target] = False
    return out


def pool_state(pool, files):
    """Which of ``files`` ({name: sha256}) the wheel pool lacks (or holds with different bytes)."""
    need = []
    for name, sha in sorted(files.items()):
        path = os.path.join(pool, name)
        if not (os.path.isfile(path) and _sha256(path) == sha):
            need.append(name)
    return {"need": need}


def pool_listing(pool):
    """Names and sizes only (no hashing): for --dry-run estimates."""
    out = {}
    if os.path.isdir(pool):
        for name in os.listdir(pool):
            path = os.path.join(pool, name)
            if os.path.isfile(path):
                out[name] = os.path.getsize(path)
    return out


def discard(folder):
    """Remove an upload's staging folder after a broken transfer (nothing in it was accepted)."""
    shutil.rmtree(folder, ignore_errors=True)
    return True


def accept(staging, dest, files, executable=False):
    """Verify files that arrived in ``staging`` against their sha256, then move them into ``dest``."""
    bad = []
    for name, sha in sorted(files.items()):
        path = os.path.join(staging, name)
        if not os.path.isfile(path):
            bad.append("%s (missing)" % name)
        elif _sha256(path) != sha:
            bad.append("%s (sha256 mismatch)" % name)
    if bad:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError("upload verification failed for %s" % ", ".join(bad))
    os.makedirs(dest, exist_ok=True)
    for name in files:
        path = os.path.join(staging, name)
        if executable:
            os.chmod(path, 0o755)
        os.replace(path, os.path.join(dest, name))
    shutil.rmtree(staging, ignore_errors=True)
    return {"accepted": sorted(files)}


def _remove_marker(venv):
    try:
        os.unlink(os.path.join(venv, MARKER))
    except FileNotFoundError:
        pass


def prepare_venv(uv, venv, interpreter, workdir, clear, allow_download, offline):
    """Create (or keep) the venv with the host's interpreter; the marker goes first, so a failure after
    this point leaves a venv that is never taken for good."""
    _remove_marker(venv)
    argv = [uv, "venv", venv, "--python", interpreter, "--no-config", "--no-project",
            "--clear" if clear else "--allow-existing"]
    if offline:
        argv.append("--offline")
    if not allow_download:
        argv.append("--no-python-downloads")
    env = {"UV_CACHE_DIR": os.path.join(workdir, "cache", "uv")}
    code, out, err = _run(argv, env=env, cwd=workdir if os.path.isdir(workdir) else None)
    if code != 0:
        return {"ok": False, "step": "uv venv", "command": argv, "message": _tail(err or out)}
    facts = python_facts(os.path.join(venv, "bin", "python"))
    if not facts.get("found"):
        return {"ok": False, "step": "uv venv", "command": argv,
                "message": "the new venv's python does not run: %s" % facts.get("error")}
    return {"ok": True, "python": facts, "output": _tail(err or out, 5)}


# Appended to torchvision_stub.py's source (sent by the controller) and run with the venv's Python.
STUB_CALL = "\nimport sysconfig as _sc\nprint(install(_sc.get_paths()['purelib']))\n"

# An engine venv's import check, run with that venv's Python behind `FORBIDDEN = [...]` and `MODULE = '...'`
# (engine_check_code): `import MODULE` works and none of the FORBIDDEN distributions is installed. The
# controller hashes the same text into the venv's marker (provision/engine_venv.py), so a changed check
# re-provisions.
ENGINE_CHECK = r"""
import importlib, importlib.metadata as md, json, sys
engine = importlib.import_module(MODULE)
def dist(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
bad = [n for n in FORBIDDEN if dist(n)]
print(json.dumps({MODULE: getattr(engine, "__version__", None), "forbidden_installed": bad}))
sys.exit(3 if bad else 0)
"""


def engine_check_code(forbidden, module):
    return "FORBIDDEN = %r\nMODULE = %r\n" % (list(forbidden), module) + ENGINE_CHECK.lstrip("\n")


def engine_setup(python, stub_source, forbidden, module):
    """After an engine venv's sync: write the torchvision stub (when given), then run the import check.
    {"ok": True, "check": what the check printed, "seconds"} or the failure (step, command, message)."""
    started = time.time()
    if stub_source:
        code, out, err = _run([python, "-c", stub_source + STUB_CALL], timeout=300)
        if code != 0:
            return {"ok": False, "step": "torchvision stub", "command": [python, "-c", "<torchvision_stub.py>"],
                    "message": _tail(err or out)}
    if not (isinstance(module, str) and all(part.isidentifier() for part in module.split("."))):
        return {"ok": False, "step": "engine import check", "command": [python, "-c", "<import check>"],
                "message": "not a module name: %r" % (module,)}
    code, out, err = _run([python, "-c", engine_check_code(forbidden, module)], timeout=900)  # import: ~10-30 s
    if code != 0:
        return {"ok": False, "step": "engine import check", "command": [python, "-c", "<import %s check>" % module],
                "message": _tail((out + "\n" + err).strip())}
    try:
        check = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        check = {"output": _tail(out, 3)}
    return {"ok": True, "check": check, "seconds": round(time.time() - started, 2)}


def sync(uv, venv, workdir, lock_name, lock_text, marker, offline, find_links, torch_backend, forbidden,
         report=None, engine=None):
    """`uv pip sync` the lock into the venv, check what got installed, run an engine's set-up (``engine``:
    {"stub_source"}; its import check refuses the FORBIDDEN distributions), then (only then) write the marker."""
    _remove_marker(venv)
    locks = os.path.join(workdir, "provision")
    os.makedirs(locks, exist_ok=True)
    lock_path = os.path.join(locks, lock_name)
    tmp = "%s.tmp-%s" % (lock_path, uuid.uuid4().hex[:8])
    with open(tmp, "w") as fh:
        fh.write(lock_text)
    os.replace(tmp, lock_path)
    python = os.path.join(venv, "bin", "python")
    argv = [uv, "pip", "sync", lock_path, "--python", python, "--require-hashes", "--no-config"]
    if offline:
        argv += ["--offline", "--no-index", "--find-links", find_links]
    elif torch_backend:
        argv += ["--torch-backend", torch_backend]
    env = {"UV_CACHE_DIR": os.path.join(workdir, "cache", "uv")}
    started = time.time()
    code, out, err = _run(argv, env=env, cwd=workdir)
    if code != 0:
        return {"ok": False, "step": "uv pip sync", "command": argv, "message": _tail(err or out)}
    seconds = time.time() - started
    names = list(report or REPORTED) + [n for n in forbidden if n not in (report or REPORTED)]
    code, pout, perr = _run([python, "-c", PACKAGE_FACTS] + names, timeout=120)
    if code != 0:
        return {"ok": False, "step": "check", "command": [python, "-c", "..."], "message": _tail(perr or pout)}
    packages = json.loads(pout)
    present = [name for name in forbidden if packages.get(name)]
    if present:
        return {"ok": False, "step": "check", "command": argv,
                "message": "installed but must not be on this host: %s" % ", ".join(present)}
    record = dict(marker)
    if engine:
        setup = engine_setup(python, engine.get("stub_source"), forbidden, engine.get("module", "vllm"))
        if not setup["ok"]:
            return setup
        record["engine_check"] = dict(setup["check"], seconds=setup["seconds"])
    record.update({"written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "lock_path": lock_path, "packages": packages})
    path = os.path.join(venv, MARKER)
    tmp = "%s.tmp-%s" % (path, uuid.uuid4().hex[:8])
    with open(tmp, "w") as fh:
        json.dump(record, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return {"ok": True, "packages": packages, "output": _tail(err or out, 8), "seconds": round(seconds, 2),
            "marker": record}
