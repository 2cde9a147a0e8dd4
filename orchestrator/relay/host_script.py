# Host side of `dfo relay-checkpoint` (stdlib only; any python3 >= 3.6 on the host).
#
# Two ways in:
#  * one-shot functions, run through remote_scripts.call (control plane): source_facts, dest_facts,
#    prepare_file, hash_ranges, hash_file, journal_drop, finalize_file, write_json, remove_paths;
#  * long-running stream processes, started by the controller as `python3 -c BOOT` over a bulk ssh
#    stream, reading this source plus a call line from stdin and then speaking a small binary protocol
#    (see _stream_reader, _stream_writer, _follow_hash, _hash_source at the bottom).
#
# Destination layout for a file FINAL:
#   FINAL.dfo-partial         preallocated to the full size, chunks written at their offsets
#   FINAL.dfo-partial.state   journal: line 1 a JSON header (source identity, size, chunk size),
#                             then one "done IDX SHA256|-" line per chunk written (appended, O_APPEND)
# The partial is renamed to FINAL (finalize_file, run by the first writer when the controller sends
# "P") only after fsync and a whole-file sha256 that matches the source.
import errno
import fcntl
import hashlib
import json
import os
import select
import stat
import struct
import sys
import time

BUF = 1 << 20
PARTIAL_SUFFIX = ".dfo-partial"
JOURNAL_SUFFIX = ".dfo-partial.state"
JOURNAL_VERSION = 1
EXIT_NOSPACE = 28
EXIT_ABORTED = 3


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


def _write_atomic(path, text):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(os.path.dirname(path) or ".")


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
    files, skipped = [], []
    for base, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(base, name)
            rel = os.path.relpath(full, root)
            if name.endswith(PARTIAL_SUFFIX) or name.endswith(JOURNAL_SUFFIX):
                skipped.append({"rel": rel, "why": "an unfinished dfo relay file"})
                continue
            try:
                st = os.stat(full)  # follows symlinks: HF snapshot folders link into blobs/
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
    return files, skipped


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
        files, skipped = _walk(path)
        return {"kind": "dir", "path": path, "realpath": os.path.realpath(path), "files": files,
                "skipped": skipped, "size": sum(f["size"] for f in files)}
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
        final = os.path.join(path, rel) if rel else path
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
            pst = os.stat(final + PARTIAL_SUFFIX)
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


def prepare_file(final, size, header, reset, preallocate=True, remove=(), lock_wait=20.0):
    """Create (or keep, when resuming) FINAL.dfo-partial at full size and its journal header.
    `remove`: paths to delete first (a stale manifest that must not vouch for a file being replaced)."""
    partial, journal = final + PARTIAL_SUFFIX, final + JOURNAL_SUFFIX
    for p in remove:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    parent = os.path.dirname(final) or "."
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        return {"error": "mkdir", "detail": "cannot create directory %s: %s" % (parent, exc.strerror)}
    if os.path.isdir(final):
        return {"error": "isdir", "detail": "%s is a directory" % final}
    if reset:
        for p in (partial, journal):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
    existed = os.path.exists(partial)
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT, 0o600)
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
                    return {"error": "nospace", "detail": "no space to preallocate %d bytes for %s (%d bytes free at %s)"
                            % (size, partial, free, where), "free_bytes": free}
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    return {"error": "open", "detail": "cannot allocate %s: %s" % (partial, exc.strerror)}
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)
    if reset or not os.path.exists(journal):
        _write_atomic(journal, json.dumps(header, sort_keys=True) + "\n")
    return {"partial": partial, "journal": journal, "resumed": existed and not reset}


def _reserve(fd, size):
    """Reserve the blocks up front (a full disk fails now, not mid-way) with fallocate(2) itself:
    glibc's posix_fallocate would emulate it on filesystems without support by writing every block,
    which takes minutes for a 17 GB file on NFS. Unsupported: say so (the caller keeps a sparse file)."""
    try:
        import ctypes
        import ctypes.util
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fallocate = libc.fallocate
        fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    except (ImportError, OSError, AttributeError):
        raise OSError(errno.EOPNOTSUPP, "fallocate unavailable")
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


def finalize_file(final, size, mode, manifest_path=None, manifest=None):
    """fsync the partial, check its size, publish it under its final name, fsync the directory;
    then write the sidecar manifest when given."""
    partial, journal = final + PARTIAL_SUFFIX, final + JOURNAL_SUFFIX
    fd = os.open(partial, os.O_RDONLY)
    try:
        actual = os.fstat(fd).st_size
        if actual != size:
            return {"error": "size", "detail": "%s holds %d bytes, expected %d" % (partial, actual, size)}
        os.fsync(fd)
    finally:
        os.close(fd)
    if mode is not None:
        os.chmod(partial, mode)
    os.replace(partial, final)
    _fsync_dir(os.path.dirname(final) or ".")
    try:
        os.unlink(journal)
    except FileNotFoundError:
        pass
    if manifest_path:
        _write_atomic(manifest_path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return {"final": final}


def write_json(path, obj):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    _write_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
    return {"path": path}


def read_json(path):
    try:
        with open(path) as fh:
            return {"data": json.load(fh)}
    except (OSError, ValueError):
        return {"data": None}


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


# ----------------------------------------------------------------------------------- stream processes
#
# Reader (source host), controller -> reader:   b"S" u32 len JSON{source_facts kwargs}           facts (K reply)
#                                               b"O" u32 len JSON{path,size,mtime_ns,ino,hash}   open a file
#                                               b"R" u64 offset u64 length                         send a range
#                                               b"F"                                               finish the file
#                       reader -> controller:   b"K" u32 len JSON   (answer to O and F)
#                                               b"D" u64 n, then n bytes   (answer to R)
#                                               b"E" u32 len message       (cannot serve R; the file changed)
# Writer (destination), controller -> writer:   b"Q" u32 len JSON{dest_facts kwargs}       "facts JSON" reply
#                                               b"O" u32 len JSON{final,size,hash,prepare?}   open (first prepare)
#                                               b"W" u64 idx u64 offset u64 length, then the bytes
#                                               b"F"                           fsync and close the file
#                                               b"P" u32 len JSON{final?,size,mode,manifest_path,manifest}
#                                                                              publish (rename) and/or manifest
#                       writer -> controller:   text lines "hello JSON", "opened JSON", "ack IDX SHA|-",
#                                               "end SHA|-", "published JSON", "facts JSON", "error KIND MSG"
# Both announce themselves first (reader: a K frame with "hello"), which proves the stream is up.

def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class _In(object):
    """Exact reads from fd 0 with no read-ahead, so chunk bodies can be spliced straight from the pipe."""

    def __init__(self):
        self.fd = 0

    def read_exact(self, n, eof_ok=False):
        out = bytearray(n)
        view = memoryview(out)
        got = 0
        while got < n:
            k = os.readv(self.fd, [view[got:]])
            if k == 0:
                if eof_ok and got == 0:
                    return b""
                raise EOFError
            got += k
        return bytes(out)

    def readinto(self, view):
        return os.readv(self.fd, [view])


def _big_pipes():
    # sshd's pipes to us are 64 KiB; 1 MiB ones mean fewer wake-ups per byte on both sides.
    setsz = getattr(fcntl, "F_SETPIPE_SZ", 1031)
    for fd in (0, 1):
        try:
            fcntl.fcntl(fd, setsz, 1 << 20)
        except OSError:
            pass


def _send_json(tag, obj):
    body = json.dumps(obj).encode()
    _write_all(1, tag + struct.pack(">I", len(body)) + body)


def _hello():
    return {"hello": True, "python": "%d.%d.%d" % sys.version_info[:3], "pid": os.getpid()}


def _read_frame_json(inp):
    return json.loads(inp.read_exact(struct.unpack(">I", inp.read_exact(4))[0]).decode())


def _stream_reader():
    _big_pipes()
    _send_json(b"K", _hello())
    inp = _In()
    buf = bytearray(BUF)
    view = memoryview(buf)
    fd, spec, h, hashed_to = None, None, None, 0
    use_sendfile = hasattr(os, "sendfile")
    while True:
        tag = inp.read_exact(1, eof_ok=True)
        if not tag:
            return 0
        if tag == b"S":
            _send_json(b"K", source_facts(**_read_frame_json(inp)))
        elif tag == b"O":
            spec = _read_frame_json(inp)
            try:
                fd = os.open(spec["path"], os.O_RDONLY)
            except OSError as exc:
                _send_json(b"K", {"error": "open", "detail": "cannot open %s: %s" % (spec["path"], exc.strerror)})
                fd = None
                continue
            why = _changed(os.fstat(fd), spec)
            h, hashed_to = (hashlib.sha256() if spec.get("hash") else None), 0
            _send_json(b"K", {"error": "changed", "detail": why} if why else {"ok": True})
        elif tag == b"R":
            offset, length = struct.unpack(">QQ", inp.read_exact(16))
            why = "no file open" if fd is None else _changed(os.fstat(fd), spec)
            if why:
                body = why.encode()
                _write_all(1, b"E" + struct.pack(">I", len(body)) + body)
                continue
            _write_all(1, b"D" + struct.pack(">Q", length))
            if h is not None and offset != hashed_to:
                h = None  # not sequential any more: no whole-file digest from this reader
            done = 0
            while done < length:
                want = min(BUF, length - done)
                if h is not None:
                    # Hash from our buffer, send from the page cache: sendfile spares the copy to the pipe.
                    n = _pread_into(fd, view[:want], offset + done)
                    if n:
                        h.update(view[:n])
                else:
                    n = want
                if n and use_sendfile:
                    try:
                        sent = 0
                        while sent < n:
                            k = os.sendfile(1, fd, offset + done + sent, n - sent)
                            if k == 0:
                                break
                            sent += k
                        n = sent
                    except OSError as exc:
                        if exc.errno not in (errno.EINVAL, errno.ENOSYS) or sent:
                            raise
                        use_sendfile = False
                if n and not use_sendfile:
                    if h is None:
                        n = _pread_into(fd, view[:want], offset + done)
                    _write_all(1, view[:n])
                if n == 0:
                    sys.stderr.write("dfo-relay: %s ended at offset %d while %d bytes were expected "
                                     "(the file shrank during the relay)\n" % (spec["path"], offset + done, spec["size"]))
                    return EXIT_ABORTED
                done += n
            if h is not None:
                hashed_to = offset + length
        elif tag == b"F":
            if fd is None:
                _send_json(b"K", {"error": "open", "detail": "no file open"})
                continue
            why = _changed(os.fstat(fd), spec, check_ino=False)
            if not why:
                try:
                    why = _changed(os.stat(spec["path"]), spec)
                except OSError as exc:
                    why = "it disappeared (%s)" % exc.strerror
            os.close(fd)
            fd = None
            digest = h.hexdigest() if (h is not None and hashed_to == spec["size"]) else None
            _send_json(b"K", {"error": "changed", "detail": why} if why else {"ok": True, "sha256": digest})
        else:
            sys.stderr.write("dfo-relay: protocol error (reader got %r)\n" % tag)
            return 2


def _say(line):
    _write_all(1, (line + "\n").encode())


class _Partial(object):
    """The destination partial, open for writing at offsets. Bytes go from our stdin pipe into the file
    with splice(2) when the system has it (no copy through this process), and are hashed from a
    read-only mapping of what was just written, so the digest is of the file's content."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR)
        self.size = os.fstat(self.fd).st_size
        self.map = None
        self.view = None
        self.splice = hasattr(os, "splice")
        if self.size:
            try:
                import mmap
                self.map = mmap.mmap(self.fd, self.size, prot=mmap.PROT_READ)
                self.view = memoryview(self.map)
            except (OSError, ValueError, ImportError):
                self.map = None

    def hash_range(self, hashers, offset, n):
        if self.view is not None:
            piece = self.view[offset:offset + n]
            for h in hashers:
                h.update(piece)
            piece.release()
            return
        data = os.pread(self.fd, n, offset)
        for h in hashers:
            h.update(data)

    def close(self):
        if self.view is not None:
            self.view.release()
            self.map.close()
        os.close(self.fd)


def _stream_writer():
    _big_pipes()
    _say("hello " + json.dumps(_hello()))
    inp = _In()
    buf = bytearray(BUF)
    view = memoryview(buf)
    part = jfd = None
    spec, whole, whole_to = None, None, 0
    while True:
        tag = inp.read_exact(1, eof_ok=True)
        if not tag:
            return 0
        if tag == b"Q":
            _say("facts " + json.dumps(dest_facts(**_read_frame_json(inp))))
        elif tag == b"O":
            spec = _read_frame_json(inp)
            spec["partial"], spec["journal"] = spec["final"] + PARTIAL_SUFFIX, spec["final"] + JOURNAL_SUFFIX
            prepared = {}
            if spec.get("prepare"):
                try:
                    prepared = prepare_file(spec["final"], spec["size"], **spec["prepare"])
                except OSError as exc:
                    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
                    free, where = _free_space(spec["final"])
                    prepared = {"error": "nospace" if full else "open",
                                "detail": "cannot prepare %s: %s (%d bytes free at %s)"
                                % (spec["partial"], exc.strerror, free, where)}
                if "error" in prepared:
                    _say("error %s %s" % (prepared["error"], prepared["detail"]))
                    continue
            try:
                part = _Partial(spec["partial"])
                jfd = os.open(spec["journal"], os.O_WRONLY | os.O_APPEND)
            except OSError as exc:
                _say("error open cannot open %s: %s" % (spec["partial"], exc.strerror))
                return 1
            fcntl.flock(part.fd, fcntl.LOCK_SH)  # tells a concurrent prepare_file that we are still writing
            whole, whole_to = (hashlib.sha256() if spec["hash"] == "file" else None), 0
            _say("opened " + json.dumps(prepared))
        elif tag == b"W":
            idx, offset, length = struct.unpack(">QQQ", inp.read_exact(24))
            h = hashlib.sha256() if spec["hash"] == "chunk" else None
            if whole is not None and offset != whole_to:
                whole = None
            hashers = [x for x in (h, whole) if x is not None]
            done = 0
            try:
                while done < length:
                    at = offset + done
                    if part.splice:
                        try:
                            n = os.splice(0, part.fd, min(BUF, length - done), offset_dst=at)
                        except OSError as exc:
                            if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                                raise
                            part.splice = False
                            continue
                        if not n:
                            return EXIT_ABORTED  # the controller went away mid-chunk: not journaled
                    else:
                        n = inp.readinto(view[:min(BUF, length - done)])
                        if not n:
                            return EXIT_ABORTED
                        written = 0
                        while written < n:
                            written += os.pwrite(part.fd, view[written:n], at + written)
                    part.hash_range(hashers, at, n)
                    done += n
            except OSError as exc:
                where = offset + done
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    free, measured = _free_space(spec["partial"])
                    _say("error nospace no space left on device writing %s at offset %d (%d bytes free at %s)"
                         % (spec["partial"], where, free, measured))
                    return EXIT_NOSPACE
                _say("error io writing %s at offset %d: %s" % (spec["partial"], where, exc.strerror))
                return 1
            if whole is not None:
                whole_to = offset + length
            digest = h.hexdigest() if h is not None else "-"
            os.write(jfd, ("done %d %s\n" % (idx, digest)).encode())
            _say("ack %d %s" % (idx, digest))
        elif tag == b"F":
            os.fsync(part.fd)
            part.close()
            os.close(jfd)
            part = jfd = None
            ok = whole is not None and whole_to == spec["size"]
            _say("end %s" % (whole.hexdigest() if ok else "-"))
        elif tag == b"P":
            req = _read_frame_json(inp)
            if req.get("final"):
                done = finalize_file(req["final"], req["size"], req.get("mode"), req.get("manifest_path"),
                                     req.get("manifest"))
            else:
                done = write_json(req["manifest_path"], req["manifest"])
            if "error" in done:
                _say("error %s %s" % (done["error"], done["detail"]))
            else:
                _say("published " + json.dumps(done))
        else:
            _say("error protocol writer got %r" % tag)
            return 2


def _follow_hash(partial, size):
    """Whole-file sha256 of the partial, hashed as the controller reports the contiguous done prefix
    ("OFFSET" lines); "end" means every chunk is written and fsynced by its writer."""
    inp = os.fdopen(0, "rb")  # nothing else reads our stdin: buffered line reads are fine here
    buf = bytearray(BUF)
    view = memoryview(buf)
    h, pos = hashlib.sha256(), 0
    with open(partial, "rb", buffering=0) as fh:
        while True:
            line = inp.readline()
            if not line:
                return EXIT_ABORTED
            line = line.strip()
            target = size if line == b"end" else int(line)
            fh.seek(pos)
            while pos < target:
                n = fh.readinto(view[:min(BUF, target - pos)])
                if not n:
                    sys.stderr.write("dfo-relay: %s is shorter than %d bytes\n" % (partial, target))
                    return 1
                h.update(view[:n])
                pos += n
            if line == b"end":
                os.fsync(fh.fileno())
                _say(json.dumps({"sha256": h.hexdigest(), "size": pos}))
                return 0


def _stdin_closed():
    ready, _, _ = select.select([0], [], [], 0)
    return bool(ready) and not os.read(0, 1)


def _hash_source(path, expect):
    """Whole-file sha256 of the source, beside the transfer; gives up when the controller goes away."""
    buf = bytearray(BUF)
    view = memoryview(buf)
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        why = _changed(os.fstat(fh.fileno()), expect)
        if why:
            _say(json.dumps({"error": "changed", "detail": why}))
            return 0
        pos, next_check = 0, 64 * BUF
        while True:
            n = fh.readinto(view)
            if not n:
                break
            h.update(view[:n])
            pos += n
            if pos >= next_check:
                next_check += 64 * BUF
                if _stdin_closed():
                    return EXIT_ABORTED
        why = _changed(os.fstat(fh.fileno()), expect, check_ino=False) or _changed(os.stat(path), expect)
    _say(json.dumps({"error": "changed", "detail": why} if why else {"sha256": h.hexdigest(), "size": pos}))
    return 0


def _dfo_stream(kind, kwargs):
    try:
        import faulthandler
        faulthandler.enable()  # a SIGBUS or crash still says something on stderr
    except Exception:
        pass
    funcs = {"reader": _stream_reader, "writer": _stream_writer, "follow": _follow_hash, "hash": _hash_source}
    try:
        code = funcs[kind](**kwargs)
    except EOFError:
        code = EXIT_ABORTED
    except BrokenPipeError:
        code = EXIT_ABORTED
    except Exception as exc:
        sys.stderr.write("dfo-relay %s: %s: %s\n" % (kind, type(exc).__name__, exc))
        code = 1
    sys.stdout.flush()
    os._exit(code)
