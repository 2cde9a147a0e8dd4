# Host side of `dfo relay-checkpoint` (stdlib only; any python3 >= 3.6 on the host): one-shot functions.
#
# Sent as one program: transport/host_prelude.py + relay/protocol.py + this file + relay/host_streams.py.
# Two ways in:
#  * one-shot functions, run through transport.hostcall (control plane): source_facts, dest_facts,
#    hash_ranges, hash_file, journal_drop, write_json, remove_paths, python_for;
#  * long-running stream processes (host_streams.py), started as `python3 -c BOOT` over bulk ssh, which
#    use prepare_file and finalize_file from here.
#
# Destination layout for a file FINAL:
#   FINAL.dfo-partial         preallocated to the full size, chunks written at their offsets; created with
#                             O_EXCL|O_NOFOLLOW (a planted symlink is never written through)
#   FINAL.dfo-partial.state   journal: line 1 a JSON header (source identity, size, chunk size),
#                             then one "done IDX SHA256|-" line per chunk written (appended, O_APPEND)
# The partial is renamed to FINAL (finalize_file) only after fsync and a whole-file sha256 that matches
# the source's. Its mode is 0644 or 0755 (protocol.safe_mode), never the source's bits as such.
#
# Symlinks in a source directory: a link to a file inside the source tree is followed (Hugging Face
# snapshot folders link into blobs/ that way when the whole cache is relayed); a link that leaves the tree
# is reported ("escapes") and the controller refuses the relay naming it; links to directories are not
# followed. At the destination nothing is written through a link: names are confined under the root.
import errno
import fcntl
import os
import stat
import time

# ----------------------------------------------------------------------------------- helpers

def _ident(st):
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino,
            "mode": stat.S_IMODE(st.st_mode)}


def _changed(st, expect, check_ino=True):
    """None when st matches the expected identity, else a sentence saying what changed."""
    if st.st_size != expect["size"]:
        return "size changed from %d to %d bytes" % (expect["size"], st.st_size)
    if st.st_mtime_ns != expect["mtime_ns"]:
        return "modification time changed (%s -> %s)" % (_ts(expect["mtime_ns"]), _ts(st.st_mtime_ns))
    if check_ino and expect.get("ino") is not None and st.st_ino != expect["ino"]:
        return "the path now names a different file (replaced by a rename)"
    return None


def _ts(ns):
    return time.strftime("%H:%M:%S", time.localtime(ns / 1e9)) + (".%03d" % ((ns // 1000000) % 1000))


def _hash_fd_range(fd, offset, length, h, view):
    done = 0
    while done < length:
        want = min(len(view), length - done)
        n = _pread_into(fd, view[:want], offset + done)
        if n == 0:
            raise IOError("file ended at offset %d, expected %d bytes" % (offset + done, offset + length))
        h.update(view[:n])
        done += n


def _pread_into(fd, view, offset):
    if hasattr(os, "preadv"):  # 3.7+: straight into our buffer
        return os.preadv(fd, [view], offset)
    data = os.pread(fd, len(view), offset)
    view[:len(data)] = data
    return len(data)


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _free_space(path):
    """(free bytes for unprivileged writers, the existing directory it was measured at)."""
    probe = path
    while probe and not os.path.isdir(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    probe = probe or "/"
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize, probe


def _write_atomic(path, text, durable=True):
    """Write TEXT to PATH atomically, through a fresh unpredictable temporary name (O_EXCL|O_NOFOLLOW:
    a name planted in a shared folder is never written through). `durable`: fsync the file and its
    directory (a journal header need not be: resume trusts no journal line without hashing the chunk)."""
    tmp = "%s.tmp-%s" % (path, os.urandom(8).hex())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_dir(os.path.dirname(path) or ".")


def _final(root, rel):
    """Where the file REL of a relay rooted at ROOT lands: ROOT itself for a single file, else ROOT/REL
    confined under ROOT (the controller checked the name too; this host checks again itself)."""
    if not rel:
        return root
    _confine(root, rel)
    folder = root
    for part in rel.split("/")[:-1]:  # no folder below ROOT may be a link (the file's own name may: it is
        folder = os.path.join(folder, part)  # replaced by a rename, never written through)
        if os.path.islink(folder):
            raise RuntimeError("refused name %r: %s is a symlink (dfo never writes through a link)" % (rel, folder))
    return os.path.join(root, rel)


def _read_journal(path):
    """(header dict, {idx: sha256 or None}) or (None, {}) when absent/unreadable."""
    try:
        with open(path, "r") as fh:
            lines = fh.read().split("\n")
    except (OSError, UnicodeDecodeError):
        return None, {}
    try:
        header = json.loads(lines[0])
    except ValueError:
        return None, {}
    done = {}
    # The last element is "" after a final newline, or a torn line (no newline): ignore either.
    for line in lines[1:-1]:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "done" and parts[1].isdigit():
            done[int(parts[1])] = None if parts[2] == "-" else parts[2]
    return header, done


# ----------------------------------------------------------------------------------- source side

def _walk(root):
    """(files, skipped, escapes): regular files under ROOT with their identities; what is left out and
    why; file symlinks that lead out of the tree (never followed: the controller refuses the relay)."""
    files, skipped, escapes = [], [], []
    real_root = os.path.realpath(root)
    for base, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(base, name)
            rel = os.path.relpath(full, root)
            if name.endswith(PARTIAL_SUFFIX) or name.endswith(JOURNAL_SUFFIX):
                skipped.append({"rel": rel, "why": "an unfinished dfo relay file"})
                continue
            if os.path.islink(full) and not _inside(os.path.realpath(full), real_root):
                escapes.append({"rel": rel, "target": os.readlink(full)})
                continue
            try:
                st = os.stat(full)  # follows a link that stays inside the tree
            except OSError as exc:
                skipped.append({"rel": rel, "why": "unreadable (%s)" % exc.strerror})
                continue
            if not stat.S_ISREG(st.st_mode):
                skipped.append({"rel": rel, "why": "not a regular file"})
                continue
            entry = _ident(st)
            entry["rel"] = rel
            files.append(entry)
        for d in list(dirs):
            if os.path.islink(os.path.join(base, d)):
                skipped.append({"rel": os.path.relpath(os.path.join(base, d), root), "why": "symlinked directory"})
    return files, skipped, escapes


def _inside(path, real_root):
    return path == real_root or path.startswith(real_root.rstrip("/") + "/")


def _snapshot(path):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {"kind": "missing", "path": path}
    if stat.S_ISREG(st.st_mode):
        out = {"kind": "file", "path": path, "realpath": os.path.realpath(path)}
        out.update(_ident(st))
        return out
    if stat.S_ISDIR(st.st_mode):
        files, skipped, escapes = _walk(path)
        return {"kind": "dir", "path": path, "realpath": os.path.realpath(path), "files": files,
                "skipped": skipped, "escapes": escapes, "size": sum(f["size"] for f in files)}
    return {"kind": "other", "path": path}


def _signature(snap):
    if snap["kind"] == "file":
        return (snap["size"], snap["mtime_ns"], snap["ino"])
    if snap["kind"] == "dir":
        return tuple((f["rel"], f["size"], f["mtime_ns"], f["ino"]) for f in snap["files"])
    return (snap["kind"],)


def source_facts(path, wait_stable=0.0, poll=1.0, max_wait=None):
    """What the source is (file / dir listing with identities); optionally wait until it is quiet."""
    started = time.time()
    snap = _snapshot(path)
    if wait_stable and snap["kind"] in ("file", "dir"):
        sig, quiet_since = _signature(snap), time.time()
        while time.time() - quiet_since < wait_stable:
            if max_wait is not None and time.time() - started > max_wait:
                snap["unstable"] = True
                break
            time.sleep(min(poll, max(0.05, wait_stable - (time.time() - quiet_since))))
            snap = _snapshot(path)
            if snap["kind"] not in ("file", "dir"):
                break
            new = _signature(snap)
            if new != sig:
                sig, quiet_since = new, time.time()
    snap["waited_s"] = round(time.time() - started, 3)
    return snap


# ----------------------------------------------------------------------------------- destination side

def dest_facts(path, rels):
    """State of the destination: kind, free space, and per file (rel "" = path itself) what exists."""
    try:
        st = os.stat(path)
        kind = "file" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "other"
    except FileNotFoundError:
        kind = "missing"
    free, measured_at = _free_space(path)
    files = []
    for rel in rels:
        final = _final(path, rel)
        entry = {"rel": rel, "final": None, "partial": None, "journal": None}
        try:
            fst = os.stat(final)
            if stat.S_ISREG(fst.st_mode):
                entry["final"] = {"size": fst.st_size, "mtime_ns": fst.st_mtime_ns}
            else:
                entry["final"] = {"not_file": True}
        except OSError:
            pass
        try:
            pst = os.lstat(final + PARTIAL_SUFFIX)  # a symlink there is not our partial
            if stat.S_ISREG(pst.st_mode):
                entry["partial"] = {"size": pst.st_size, "allocated": pst.st_blocks * 512}
        except OSError:
            pass
        header, done = _read_journal(final + JOURNAL_SUFFIX)
        if header is not None:
            entry["journal"] = {"header": header, "done": {str(k): v for k, v in done.items()}}
        files.append(entry)
    parent = path if kind == "dir" else os.path.dirname(path) or "/"
    writable_at = parent
    while not os.path.isdir(writable_at) and os.path.dirname(writable_at) != writable_at:
        writable_at = os.path.dirname(writable_at)
    return {"kind": kind, "free_bytes": free, "free_measured_at": measured_at, "files": files,
            "writable": os.access(writable_at, os.W_OK | os.X_OK), "writable_checked_at": writable_at}


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
SMALL_RESERVE = 64 << 20


def prepare_file(final, size, header, reset, preallocate=True, remove_manifest=False, lock_wait=20.0):
    """Create (or keep, when resuming) FINAL.dfo-partial at full size and its journal header.
    `remove_manifest`: delete FINAL's sidecar manifest first (it must not vouch for a file being replaced)."""
    partial, journal = final + PARTIAL_SUFFIX, final + JOURNAL_SUFFIX
    if remove_manifest:
        _unlink(final.rstrip("/") + MANIFEST_SUFFIX)
    parent = os.path.dirname(final) or "."
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        return {"error": "mkdir", "detail": "cannot create directory %s: %s" % (parent, exc.strerror)}
    if os.path.isdir(final):
        return {"error": "isdir", "detail": "%s is a directory" % final}
    try:
        existed = stat.S_ISREG(os.lstat(partial).st_mode) and not reset
    except OSError:
        existed = False
    if not existed:  # start over: whatever sits at these names (a planted symlink too) goes
        _unlink(partial)
        _unlink(journal)
    try:
        if existed:
            fd = os.open(partial, os.O_WRONLY | _NOFOLLOW)
        else:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    except OSError as exc:
        return {"error": "open", "detail": "cannot create %s: %s" % (partial, exc.strerror)}
    try:
        # Writers of a relay still running hold a shared lock on the partial. Writers of an interrupted
        # relay notice within moments that their input is gone; wait a little for them.
        deadline = time.time() + lock_wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.time() > deadline:
                    return {"error": "busy", "detail": "another relay is still writing %s" % partial}
                time.sleep(0.2)
        if preallocate and size:
            try:
                _reserve(fd, size)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    if not existed:
                        os.unlink(partial)
                    free, where = _free_space(parent)
                    return {"error": "nospace", "free_bytes": free, "detail": "no space to preallocate %d bytes for %s "
                            "(%d bytes free at %s)" % (size, partial, free, where)}
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    return {"error": "open", "detail": "cannot allocate %s: %s" % (partial, exc.strerror)}
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)
    if not existed or not os.path.lexists(journal):
        _write_atomic(journal, json.dumps(header, sort_keys=True) + "\n", durable=False)
    return {"partial": partial, "journal": journal, "resumed": existed and not reset}


def _reserve(fd, size):
    """Reserve the blocks up front (a full disk fails now, not mid-way) with fallocate(2) itself:
    glibc's posix_fallocate would emulate it on filesystems without support by writing every block,
    which takes minutes for a 17 GB file on NFS. Unsupported: say so (the caller keeps a sparse file).
    A small file takes posix_fallocate (that emulation is brief there), sparing ctypes' import."""
    if size <= SMALL_RESERVE and hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, size)
        return
    try:
        import ctypes
        import ctypes.util
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fallocate = libc.fallocate
        fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    except (ImportError, OSError, AttributeError):
        raise OSError(errno.EOPNOTSUPP, "fallocate unavailable") from None
    if fallocate(fd, 0, 0, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def hash_ranges(path, ranges, expect=None):
    """sha256 of each (offset, length) range of a file; `expect` pins the file's identity."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if expect is not None:
            why = _changed(os.fstat(fd), expect)
            if why:
                return {"error": "changed", "detail": why}
        buf = bytearray(BUF)
        view = memoryview(buf)
        out = []
        for offset, length in ranges:
            h = hashlib.sha256()
            _hash_fd_range(fd, offset, length, h, view)
            out.append(h.hexdigest())
        if expect is not None:
            why = _changed(os.fstat(fd), expect) or _changed(os.stat(path), expect)
            if why:
                return {"error": "changed", "detail": why}
        return {"digests": out}
    finally:
        os.close(fd)


def hash_file(path, expect=None):
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        return {"error": "missing", "detail": "%s: %s" % (path, exc.strerror)}
    result = hash_ranges(path, [(0, size)], expect)
    if "error" in result:
        return result
    return {"sha256": result["digests"][0], "size": size}


def journal_drop(final, indices):
    """Forget chunks (they failed verification) so the next run sends them again."""
    journal = final + JOURNAL_SUFFIX
    header, done = _read_journal(journal)
    if header is None:
        return {"dropped": 0}
    drop = set(indices)
    lines = [json.dumps(header, sort_keys=True)]
    lines += ["done %d %s" % (i, d or "-") for i, d in sorted(done.items()) if i not in drop]
    _write_atomic(journal, "\n".join(lines) + "\n")
    return {"dropped": len(drop & set(done))}


def finalize_file(final, size, mode):
    """fsync the partial, check its size, publish it under its final name (mode 0644/0755), fsync the
    directory."""
    partial, journal = final + PARTIAL_SUFFIX, final + JOURNAL_SUFFIX
    fd = os.open(partial, os.O_RDONLY | _NOFOLLOW)
    try:
        actual = os.fstat(fd).st_size
        if actual != size:
            return {"error": "size", "detail": "%s holds %d bytes, expected %d" % (partial, actual, size)}
        os.fsync(fd)
        os.fchmod(fd, safe_mode(mode))
    finally:
        os.close(fd)
    os.replace(partial, final)
    _fsync_dir(os.path.dirname(final) or ".")
    _unlink(journal)
    return {"final": final}


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_json(path, obj):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    _write_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
    return {"path": path}


def remove_paths(paths, trees=()):
    import shutil
    removed = []
    for p in paths:
        try:
            os.unlink(p)
            removed.append(p)
        except FileNotFoundError:
            pass
    for p in trees:
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return {"removed": removed}


def python_for(venv, fallback):
    """The interpreter to run the payload with: the host's venv when it exists, else `fallback`."""
    candidate = os.path.join(venv, "bin", "python")
    return {"python": candidate if os.access(candidate, os.X_OK) else fallback}


