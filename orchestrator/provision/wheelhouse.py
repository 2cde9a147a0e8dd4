"""Payload requirement locks and controller-side wheelhouses for hosts without internet.

A *lock* (``remote_payload/requirements-<flavour>.lock``) pins every package with its sha256 hashes; its
header carries ``# dfo-<key>: value`` lines (flavour, torch backend, ...). A *wheelhouse* is the set of
wheels a lock needs on one target (Python version, ABI, platform, environment markers), downloaded on the
controller with pip (uv has no `pip download`) and cached under ``$DFO_CACHE/wheelhouse/`` (default
``~/.cache/dfo``) so it is built once; it is complete only once its ``MANIFEST.json`` exists (built in a
temporary directory, renamed at the end).

The target's facts come from the host, so its cache folder is confined under the cache, and a cached folder is
used only when it holds exactly what the lock pins: every file a plain wheel name, a regular file of the listed
size, with a sha256 the lock pins (and that sha256 is checked again before a file is uploaded). Whoever wrote a
folder, nothing but the lock's own wheels can leave the controller from it.

Also the lock generator: ``python -m orchestrator.provision.wheelhouse compile-lock cpu|cuda|vllm-cuda`` (see
LOCK_SPECS).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core.confine import check_component, confine
from orchestrator.core.errors import HostError, InputError, OperationError
from orchestrator.core.hashing import sha256_file

PAYLOAD_DIR = Path(__file__).resolve().parents[2] / "remote_payload"
MANIFEST = "MANIFEST.json"
_WHEEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!-]{0,250}\.whl\Z")  # a wheel's file name, nothing else
_SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
_BUILD_LOCK = threading.Lock()

try:  # `packaging` comes with pip, which the wheelhouse needs anyway
    from packaging.markers import InvalidMarker, Marker
except ImportError:  # pragma: no cover - only without a standalone packaging
    from pip._vendor.packaging.markers import InvalidMarker, Marker  # type: ignore


# ------------------------------------------------------------------------------------ locks


@dataclass(frozen=True)
class LockedRequirement:
    name: str
    version: str
    marker: str | None
    hashes: tuple[str, ...]  # "sha256:<hex>"

    def line(self, with_marker: bool = True) -> str:
        spec = f"{self.name}=={self.version}"
        if with_marker and self.marker:
            spec += f" ; {self.marker}"
        return " ".join([spec, *(f"--hash={h}" for h in self.hashes)])

    def applies(self, environment: dict[str, str]) -> bool:
        return not self.marker or Marker(self.marker).evaluate(environment)


@dataclass(frozen=True)
class Lock:
    path: Path
    text: str
    requirements: tuple[LockedRequirement, ...]
    header: dict[str, str] = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def flavour(self) -> str | None:
        return self.header.get("flavour")

    @property
    def torch_backend(self) -> str | None:
        return self.header.get("torch-backend")

    @property
    def online_torch_backend(self) -> str | None:
        """`--torch-backend` for online installs (set when torch comes from the PyTorch index, not PyPI)."""
        return self.header.get("online-torch-backend")

    def names(self) -> set[str]:
        return {r.name for r in self.requirements}

    def select(self, environment: dict[str, str]) -> list[LockedRequirement]:
        """The requirements whose markers hold in ``environment`` (a PEP 508 marker environment)."""
        return [r for r in self.requirements if r.applies(environment)]


_REQ_RE = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(?P<version>[^\s;]+)\s*(?:;(?P<marker>.*))?\Z")
_HEADER_RE = re.compile(r"^#\s*dfo-(?P<key>[a-z0-9-]+):\s*(?P<value>.*?)\s*\Z")


def canonical_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str, path: Path) -> Lock:
    """Parse a hash-pinned requirements file as `uv pip compile --generate-hashes` writes it.

    Errors name the file and line: every requirement must be ``name==version`` with at least one hash.
    """
    header: dict[str, str] = {}
    logical: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        m = _HEADER_RE.match(raw)
        if m:
            header[m["key"]] = m["value"]
            continue
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line and not pending:
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append((start, pending + line))
        pending = ""
    if pending.strip():
        logical.append((start, pending))

    reqs = []
    for number, line in logical:
        tokens = line.split()
        hashes = tuple(t.split("=", 1)[1] for t in tokens if t.startswith("--hash="))
        others = [t for t in tokens if t.startswith("-") and not t.startswith("--hash=")]
        if others:
            raise InputError(f"{path}:{number}: unsupported option {others[0]!r} in a dfo lock",
                             hint="a lock holds only `name==version ; marker --hash=sha256:...` lines")
        spec = " ".join(t for t in tokens if not t.startswith("--hash="))
        m = _REQ_RE.match(spec)
        if not m:
            raise InputError(f"{path}:{number}: expected `name==version` (pinned), got {spec!r}",
                             hint="regenerate the lock with `uv pip compile --generate-hashes`")
        if not hashes:
            raise InputError(f"{path}:{number}: {m['name']}=={m['version']} has no --hash",
                             hint="locks must carry hashes: regenerate with `uv pip compile --generate-hashes`")
        bad = [h for h in hashes if not re.fullmatch(r"sha256:[0-9a-f]{64}", h)]
        if bad:
            raise InputError(f"{path}:{number}: malformed hash {bad[0]!r} (expected sha256:<64 hex digits>)")
        marker = (m["marker"] or "").strip() or None
        if marker:
            try:
                Marker(marker)
            except InvalidMarker as exc:
                raise InputError(f"{path}:{number}: invalid environment marker {marker!r}: {exc}") from None
        reqs.append(LockedRequirement(canonical_name(m["name"]), m["version"], marker, hashes))
    if not reqs:
        raise InputError(f"{path}: the lock lists no requirements")
    return Lock(path=path, text=text, requirements=tuple(reqs), header=header)


def load_lock(path: str | os.PathLike) -> Lock:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"lock file not found: {path}",
                         hint="generate it: python -m orchestrator.provision.wheelhouse compile-lock cpu|cuda",
                         ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read lock {path}: {exc}") from None
    return parse_lock(text, path)


# ------------------------------------------------------------------------------ wheelhouse


@dataclass(frozen=True)
class Target:
    """Where wheels must install: facts reported by the host's interpreter (see provision_host.python_facts)."""

    python_version: str           # "3.11.2"
    implementation: str           # "cp"
    abi: str                      # "cp311"
    machine: str                  # "x86_64"
    glibc: str | None             # "2.36"; None: not glibc (musl...) -> only pure wheels
    markers: dict[str, str]       # PEP 508 environment

    @property
    def short_version(self) -> str:
        return "".join(self.python_version.split(".")[:2])

    @property
    def platforms(self) -> list[str]:
        if not self.glibc:
            return []
        major, minor = (int(x) for x in self.glibc.split(".")[:2])
        # pip does not expand manylinux_2_X to the older tags a glibc also runs: list them all (PEP 600),
        # with the legacy aliases manylinux2014 (2.17), manylinux2010 (2.12) and manylinux1 (2.5).
        tags = [f"manylinux_{major}_{m}_{self.machine}" for m in range(minor, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        tags += [f"{name}_{self.machine}" for m, name in legacy.items() if m <= minor]
        return tags + [f"linux_{self.machine}"]

    @property
    def label(self) -> str:
        plat = self.platforms[0] if self.platforms else f"pure-{self.machine}"
        return f"{self.implementation}{self.short_version}-{plat}"


@dataclass
class Wheelhouse:
    path: Path
    files: dict[str, dict]  # file name -> {"sha256", "size"}
    built: bool = False     # built by this call (False: from the cache)

    def upload_set(self, names: list[str], *, host: str) -> dict[str, tuple[Path, str]]:
        """{name: (local path, sha256)} for NAMES (what a host said it lacks): each a wheel of this wheelhouse,
        opened from inside its folder only, its bytes checked against the manifest's sha256 now."""
        out = {}
        for name in names:
            meta = self.files.get(name)
            if meta is None:
                raise HostError(host, f"refused to upload {name!r:.200}: not a wheel of {self.path}")
            path = confine(self.path, name, host=host, what="wheel name")
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size != meta["size"] or sha256_file(path) != meta["sha256"]:
                raise HostError(host, f"{path} is not the wheel the wheelhouse's manifest lists (changed since it "
                                "was built?); nothing was uploaded",
                                hint=f"remove {self.path} and run dfo provision again: it is rebuilt")
            out[name] = (path, meta["sha256"])
        return out

    @property
    def total_bytes(self) -> int:
        return sum(f["size"] for f in self.files.values())

    def unpacked_bytes(self) -> int:
        """What the wheels hold uncompressed (read from their zip directories; no extraction)."""
        total = 0
        for name in self.files:
            try:
                with zipfile.ZipFile(self.path / name) as zf:
                    total += sum(info.file_size for info in zf.infolist())
            except (OSError, zipfile.BadZipFile):
                total += int(self.files[name]["size"])
        return total


def cache_dir() -> Path:
    """dfo's controller-side cache: $DFO_CACHE, else $XDG_CACHE_HOME/dfo, else ~/.cache/dfo."""
    if os.environ.get("DFO_CACHE"):
        return Path(os.environ["DFO_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dfo"


def wheelhouse_key(lock: Lock, target: Target) -> tuple[str, list[LockedRequirement]]:
    selected = lock.select(target.markers)
    ident = json.dumps([target.label, sorted(r.line(False) for r in selected)], sort_keys=True)
    return f"{lock.sha256[:16]}/{target.label}-{hashlib.sha256(ident.encode()).hexdigest()[:10]}", selected


def wheelhouse_dir(lock: Lock, target: Target, root: Path | None = None, *, host: str) -> Path:
    """<root>/wheelhouse/<lock>/<label>-<hash>: the target came from HOST, so its label must be one plain name
    and the folder must stay under <root>/wheelhouse (a HostError naming the host otherwise)."""
    key, _ = wheelhouse_key(lock, target)
    base = (root or cache_dir()) / "wheelhouse"
    check_component(target.label, host=host, what="wheelhouse label (from its Python facts)")
    confine(base, key, host=host, what="wheelhouse cache folder")
    return base / key


def cached_wheelhouse(lock: Lock, target: Target, root: Path | None = None, *, host: str,
                      on_notice=None) -> Wheelhouse | None:
    """The cached wheelhouse for (lock, target), or None when there is none dfo can use (``on_notice`` hears why
    an existing one is not used)."""
    path = wheelhouse_dir(lock, target, root, host=host)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        manifest = exc
    files, problem = _trusted_files(path, manifest, lock, target)
    if files is None:
        if on_notice:
            on_notice(f"not using the cached wheelhouse {path}: {problem}")
        return None
    return Wheelhouse(path, files)


def _trusted_files(path: Path, manifest: object, lock: Lock, target: Target) -> tuple[dict | None, str]:
    """The manifest's files when the folder holds exactly what the lock pins for TARGET; else (None, why)."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return None, f"{MANIFEST} is not a manifest dfo writes ({str(manifest)[:80]})"
    if manifest.get("lock_sha256") != lock.sha256 or manifest.get("target") != target.label:
        return None, f"{MANIFEST} is for another lock or target"
    selected = lock.select(target.markers)
    pinned = {h.removeprefix("sha256:") for r in selected for h in r.hashes}
    files: dict[str, dict] = {}
    for name, meta in manifest["files"].items():
        sha, size = (meta.get("sha256"), meta.get("size")) if isinstance(meta, dict) else (None, None)
        wheel = isinstance(name, str) and _WHEEL_RE.fullmatch(name) is not None
        if not (wheel and isinstance(sha, str) and _SHA256_RE.fullmatch(sha) and isinstance(size, int)
                and not isinstance(size, bool)):
            return None, f"{MANIFEST} lists {name!r:.80} with {meta!r:.80}: not a wheel name, sha256 and size"
        if sha not in pinned:
            return None, f"{name} has a sha256 the lock does not pin"
        try:
            st = os.lstat(path / name)
        except OSError:
            return None, f"{name} is missing"
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return None, f"{name} is not a regular file of {size} bytes"
        files[name] = {"sha256": sha, "size": size}
    missing = _missing(selected, files)
    if missing:
        return None, f"it lacks {', '.join(missing)}"
    return files, ""


def pip_download_argv(requirements_file: Path, dest: Path, target: Target, python: str = sys.executable) -> list[str]:
    argv = [python, "-m", "pip", "download", "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
            # pip checks each wheel's Requires-Python against the target (uv does not, for find-links wheels).
            "--no-deps", "--require-hashes", "--only-binary=:all:", "--dest", str(dest),
            "--python-version", target.short_version, "--implementation", target.implementation,
            "--abi", target.abi, "--abi", "abi3", "--abi", "none"]
    for plat in target.platforms or ["any"]:
        argv += ["--platform", plat]
    return argv + ["-r", str(requirements_file)]


def build_wheelhouse(lock: Lock, target: Target, *, root: Path | None = None, host: str = "",
                     on_notice=None) -> Wheelhouse:
    """The wheelhouse for ``lock`` on ``target``: from the cache, or downloaded now with pip and cached.

    pip checks every file against the lock's hashes (--require-hashes) and uses pip's own configuration
    (index, find-links: that is how a locally available CPU torch wheel gets in). Failures raise
    OperationError with pip's message, the lock and the host it was for.
    """
    _, selected = wheelhouse_key(lock, target)
    final = wheelhouse_dir(lock, target, root, host=host or "controller")
    final.parent.mkdir(parents=True, exist_ok=True)
    with _BUILD_LOCK, open(final.parent / f".{final.name}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # another dfo process may be building the same one
        cached = cached_wheelhouse(lock, target, root, host=host or "controller", on_notice=on_notice)
        if cached is not None:
            return cached
        if on_notice:
            on_notice(f"building wheelhouse for {lock.name} ({target.label}, {len(selected)} packages) in {final}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            reqs = tmp / "requirements.txt"
            reqs.write_text("".join(r.line(with_marker=False) + "\n" for r in selected))
            wheels = tmp / "wheels"
            wheels.mkdir()
            proc = subprocess.run(pip_download_argv(reqs, wheels, target), capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                detail = _pip_error(proc.stdout + proc.stderr)
                raise OperationError(
                    f"{host + ': ' if host else ''}building the wheelhouse for {lock.path} failed (pip download):\n"
                    f"{detail}",
                    hint="check the lock's pins and hashes, and that pip can reach an index or find-links "
                    "holding them (pip config list)",
                )
            files = {}
            for wheel in sorted(wheels.iterdir()):
                files[wheel.name] = {"sha256": sha256_file(wheel), "size": wheel.stat().st_size}
            manifest = {"lock": lock.name, "lock_sha256": lock.sha256, "target": target.label, "files": files}
            _, problem = _trusted_files(wheels, manifest, lock, target)  # what a later run would refuse to use
            if problem:
                raise OperationError(f"the wheelhouse pip downloaded for {lock.path} is not usable: {problem}")
            (wheels / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            publish_dir(wheels, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return Wheelhouse(final, files, built=True)


def publish_dir(new: Path, final: Path, keep_old_s: float = 600.0) -> None:
    """Make ``final`` show ``new`` in one step: ``final`` is a symlink to a uniquely named sibling, switched
    with rename(2), so a reader sees the old complete folder or the new one, never a half-deleted one.
    Replaced folders are removed on a later publish, once older than ``keep_old_s`` (a reader that
    opened one just before the switch can finish)."""
    real = final.with_name(f".{final.name}.v-{uuid.uuid4().hex[:12]}")
    os.rename(new, real)
    link = final.with_name(f".{final.name}.link-{uuid.uuid4().hex[:8]}")
    os.symlink(real.name, link)
    if final.exists() and not final.is_symlink():  # a folder from an older dfo: set aside first
        os.rename(final, final.with_name(f".{final.name}.v-{uuid.uuid4().hex[:12]}"))
    os.replace(link, final)
    now = time.time()
    for old in final.parent.glob(f".{final.name}.v-*"):
        if old.name != real.name and now - old.stat().st_mtime > keep_old_s:
            shutil.rmtree(old, ignore_errors=True)


def _pip_error(output: str) -> str:
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR") or "error" in ln.lower()]
    return "\n".join((errors or lines)[-12:])


def _missing(selected: list[LockedRequirement], files: dict[str, dict]) -> list[str]:
    """The requirements none of FILES satisfies (by the lock's hashes)."""
    by_hash = {f"sha256:{meta['sha256']}" for meta in files.values()}
    return [r.name for r in selected if not any(h in by_hash for h in r.hashes)]


# --------------------------------------------------------------------------- lock generation

# How each shipped lock is made. uv resolves against PyPI only (--no-config: no user/site uv.toml). The
# CPU torch build is not on PyPI: it comes from a find-links directory holding torch-2.13.0+cpu (pip finds
# it on this project's machines through its find-links config; uv needs --find-links). The cuda lock is
# universal (markers kept) so it installs on any Linux Python >= 3.11 of a GPU host; its torch is PyPI's
# default CUDA build (CUDA 13.0 runtime wheels as of torch 2.13.0).
LOCK_SPECS: dict[str, dict] = {
    "cpu": {
        "summary": "torch 2.13.0 CPU build, transformers 5.24.0, safetensors, accelerate, tokenizers, numpy. "
                   "NO flash-linear-attention, NO triton: with triton next to fla every Qwen3.5 forward on a "
                   "CPU host fails ('0 active drivers'; see ml-stack.md).",
        "header": {"flavour": "cpu", "torch-backend": "cpu", "online-torch-backend": "cpu",
                   "python": "3.11 (x86_64 Linux, manylinux_2_28+: the +cpu torch wheel here is cp311 only)"},
        "args": ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28"],
        "find_links": True,
    },
    "cuda": {
        "summary": "CUDA torch 2.13.0 (PyPI build, CUDA 13.0 runtime wheels), transformers 5.24.0, "
                   "flash-linear-attention + triton, safetensors, accelerate, tokenizers, numpy. GPU hosts only.",
        "header": {"flavour": "cuda", "torch-backend": "cu130",
                   "python": ">=3.11 (universal: environment markers kept)"},
        "args": ["--universal", "--python-version", "3.11"],
        "find_links": False,
    },
    # The engine venv of GPU hosts (`dfo provision --engine vllm`; see orchestrator/provision/engine.py). The
    # CPU engine's lock (requirements-vllm-cpu.lock) is made by the command in its own header.
    "vllm-cuda": {
        "summary": "vllm 0.32.0 (CUDA build from PyPI) with PyPI's default CUDA torch 2.13.0 and the "
                   "torchvision/torchaudio it pins. GPU hosts only; never installed on the project's machines.",
        "header": {"flavour": "vllm-cuda", "torch-backend": "cu130",
                   "python": ">=3.11 (universal: environment markers kept)"},
        "args": ["--universal", "--python-version", "3.11"],
        "find_links": False,
    },
}


def compile_argv(flavour: str, uv: str, find_links: str | None) -> list[str]:
    spec = LOCK_SPECS[flavour]
    argv = [uv, "pip", "compile", str(PAYLOAD_DIR / f"requirements-{flavour}.in"), "--generate-hashes",
            "--no-header", "--no-config", "--index-url", "https://pypi.org/simple", *spec["args"]]
    if spec["find_links"]:
        if not find_links:
            raise InputError(f"the {flavour} lock needs --find-links DIR holding torch-2.13.0+cpu (e.g. /opt/wheels)")
        argv += ["--find-links", find_links]
    return argv


def lock_header(flavour: str, argv: list[str]) -> str:
    spec = LOCK_SPECS[flavour]
    shown = ["uv", *[a.replace(str(PAYLOAD_DIR.parent) + os.sep, "") for a in argv[1:]]]
    lines = [
        f"# dfo {'engine' if flavour.startswith('vllm') else 'payload'} lock, flavour {flavour}: {spec['summary']}",
        *(f"# dfo-{k}: {v}" for k, v in spec["header"].items()),
        f"# Source: remote_payload/requirements-{flavour}.in (edit that, not this file). Regenerate from the",
        "# repository root with:",
        f"#   .venv/bin/python -m orchestrator.provision.wheelhouse compile-lock {flavour}"
        + (" [--find-links DIR]" if spec["find_links"] else ""),
        "# which runs:",
        "#   " + " ".join(shown) + " -o <tmp>",
        "# and prepends this header. `dfo provision` re-syncs every host whose venv marker differs.",
    ]
    if spec["find_links"]:
        lines.append("# Check afterwards: torch's --hash must equal "
                     "`sha256sum <find-links dir>/torch-2.13.0+cpu-*.whl`.")
    return "\n".join(lines) + "\n"


def compile_lock(flavour: str, *, find_links: str | None = None, uv: str | None = None) -> Path:
    """Regenerate remote_payload/requirements-<flavour>.lock with uv (needs the package index)."""
    if flavour not in LOCK_SPECS:
        raise InputError(f"unknown lock flavour {flavour!r}; expected one of {', '.join(LOCK_SPECS)}")
    uv = uv or _controller_uv()
    if LOCK_SPECS[flavour]["find_links"] and not find_links:
        find_links = "/opt/wheels" if os.path.isdir("/opt/wheels") else None
    argv = compile_argv(flavour, uv, find_links)
    out = PAYLOAD_DIR / f"requirements-{flavour}.lock"
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "lock.txt"
        proc = subprocess.run([*argv, "-o", str(body)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise OperationError(f"uv pip compile for {flavour} failed:\n{proc.stderr.strip()[-3000:]}")
        text = lock_header(flavour, argv) + body.read_text()
    parse_lock(text, out)  # refuse to write something dfo cannot read back
    tmp_out = out.with_name(f".{out.name}.tmp")
    tmp_out.write_text(text)
    os.replace(tmp_out, out)
    return out


def _controller_uv() -> str:
    try:
        from uv import find_uv_bin  # the `uv` wheel installed next to dfo

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if not found:
            raise InputError("uv not found on the controller", hint="pip install uv==0.13.9 (dfo[test])") from None
        return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.provision.wheelhouse",
                                     description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    comp = sub.add_parser("compile-lock", help="regenerate remote_payload/requirements-<flavour>.lock")
    comp.add_argument("flavour", choices=sorted(LOCK_SPECS))
    comp.add_argument("--find-links", help="directory holding torch-2.13.0+cpu (cpu lock; default /opt/wheels)")
    args = parser.parse_args(argv)
    try:
        path = compile_lock(args.flavour, find_links=args.find_links)
    except (InputError, OperationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    lock = load_lock(path)
    print(f"wrote {path}: {len(lock.requirements)} packages, sha256 {lock.sha256[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
