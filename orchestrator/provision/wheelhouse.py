"""Controller-side wheelhouses for hosts without internet: the wheels a lock needs on one target.

A *wheelhouse* is the set of wheels a lock (``lock.py``) needs on one target (Python version, ABI, platform,
environment markers), downloaded on the controller with pip (uv has no `pip download`) and cached under
``$DFO_CACHE/wheelhouse/`` (default ``~/.cache/dfo``) so it is built once; it is complete only once its
``MANIFEST.json`` exists (built in a temporary directory, published with one rename at the end).

The target's facts come from the host, so its cache folder is confined under the cache, and a cached folder is
used only when it holds exactly what the lock pins: every file a plain wheel name, a regular file of the listed
size, with a sha256 the lock pins (and that sha256 is checked again before a file is uploaded). Whoever wrote a
folder, nothing but the lock's own wheels can leave the controller from it.
"""

from __future__ import annotations

import errno
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
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.confine import check_component, confine
from orchestrator.core.errors import HostError, OperationError
from orchestrator.core.hashing import sha256_file
from orchestrator.provision.lock import Lock, LockedRequirement

MANIFEST = "MANIFEST.json"
_WHEEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!-]{0,250}\.whl\Z")  # a wheel's file name, nothing else
_SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
_BUILD_LOCK = threading.Lock()


@dataclass(frozen=True)
class Target:
    """Where wheels must install: facts reported by the host's interpreter (host_script.py ``python_facts``)."""

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


def _exchange(a: Path, b: Path) -> bool:
    """Swap two names atomically (Linux renameat2 with RENAME_EXCHANGE); False where the system cannot."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def publish_dir(new: Path, final: Path, keep_old_s: float = 600.0) -> None:
    """Make ``final`` show ``new`` in one step: ``final`` is a symlink to a uniquely named sibling, switched
    with rename(2), so a reader sees the old complete folder or the new one, never a half-deleted one.
    Replaced folders are removed on a later publish, once older than ``keep_old_s`` (a reader that
    opened one just before the switch can finish)."""
    real = final.with_name(f".{final.name}.v-{uuid.uuid4().hex[:12]}")
    os.rename(new, real)
    link = final.with_name(f".{final.name}.link-{uuid.uuid4().hex[:8]}")
    os.symlink(real.name, link)
    if final.exists() and not final.is_symlink():  # a folder from an older dfo: rename(2) cannot replace it
        aside = final.with_name(f".{final.name}.v-{uuid.uuid4().hex[:12]}")
        if _exchange(link, final):  # one step: FINAL is the link, LINK's name holds the old folder
            os.rename(link, aside)
        else:  # no renameat2 here: a short moment without FINAL
            os.rename(final, aside)
            os.replace(link, final)
    else:
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
