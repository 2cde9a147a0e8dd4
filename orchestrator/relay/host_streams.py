# ruff: noqa: F821 -- runs behind the prelude, protocol.py and host_script.py, which define these names
# Host side of `dfo relay-checkpoint`: the long-running stream processes (stdlib only, python3 >= 3.6).
#
# Sent after host_script.py (see its header); started as `python3 -c BOOT` over a bulk ssh stream, BOOT
# reads this program plus a `_dfo_stream(KIND, KWARGS)` line from stdin. The wire protocol (frames,
# tags, the writer's sealed commands) is described in protocol.py.
#
#   reader   source host: stdin = the controller's requests, stdout = the pipe to the writer
#   writer   destination host: stdin = that pipe, stdout = lines to the controller
#   follow   destination host: whole-file sha256 of the partial as its done prefix grows (parallel mode)
#   hash     source host: whole-file sha256 of the source beside the transfer (parallel mode)
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

    def read_len(self):
        return struct.unpack(LEN_FMT, self.read_exact(4))[0]

    def read_json(self):
        return json.loads(self.read_exact(self.read_len()).decode())

    def readinto(self, view):
        return os.readv(self.fd, [view])


def _big_pipes():
    # sshd's pipes to us are 64 KiB; 1 MiB ones mean fewer wake-ups per byte on both sides.
    setsz = getattr(fcntl, "F_SETPIPE_SZ", 1031)
    for fd in (0, 1):
        try:
            fcntl.fcntl(fd, setsz, PIPE_SIZE)
        except OSError:
            pass


def _hello():
    return {"hello": True, "python": "%d.%d.%d" % sys.version_info[:3], "pid": os.getpid()}


def _say(line):
    _write_all(1, (line + "\n").encode())


# ----------------------------------------------------------------------------------- reader (source host)

class _Reader(object):
    def __init__(self):
        self.fd = None
        self.spec = {}  # type: dict  # the open file's, as the controller sent it
        self.whole = None       # sequential mode: sha256 of the file, in order
        self.hashed_to = 0
        self.view = memoryview(bytearray(BUF))
        self.sendfile = hasattr(os, "sendfile")
        self.next_slot = time.time()

    def open(self, spec):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        root = spec.get("root")
        if root and not _inside(os.path.realpath(spec["path"]), os.path.realpath(root)):
            return {"error": "escapes", "detail": "%s leads out of %s (a symlink?)" % (spec["path"], root)}
        try:
            self.fd = os.open(spec["path"], os.O_RDONLY)
        except OSError as exc:
            return {"error": "open", "detail": "cannot open %s: %s" % (spec["path"], exc.strerror)}
        self.spec = spec
        self.whole, self.hashed_to = (hashlib.sha256() if spec.get("hash") == "file" else None), 0
        why = _changed(os.fstat(self.fd), spec)
        return {"error": "changed", "detail": why} if why else {"ok": True}

    def send_range(self, idx, offset, length):
        """DATA header and bytes into the pipe; the chunk's sha256 after it in chunk mode. Returns an exit
        code when the process must stop."""
        if self.fd is None:
            self._refuse(idx, "no file open")
            return None
        why = _changed(os.fstat(self.fd), self.spec)
        if why:
            self._refuse(idx, why)
            return None
        _write_all(1, range_frame(DATA, idx, offset, length))
        if self.whole is not None and offset != self.hashed_to:
            self.whole = None  # not in order any more: no whole-file digest from this reader
        h = hashlib.sha256() if self.spec.get("hash") == "chunk" else self.whole
        done = 0
        while done < length:
            n = self._send_piece(self.fd, offset + done, min(BUF, length - done), h)
            if n == 0:
                sys.stderr.write("dfo-relay: %s ended at offset %d while %d bytes were expected "
                                 "(the file shrank during the relay)\n" % (self.spec["path"], offset + done,
                                                                          self.spec["size"]))
                return EXIT_ABORTED
            done += n
        if self.whole is not None:
            self.hashed_to = offset + length
        if h is not None and h is not self.whole:
            _write_all(1, frame(REPLY, {"chunk": idx, "sha256": h.hexdigest()}))
        return None

    def _refuse(self, idx, why):
        _write_all(1, frame(REPLY, {"error": "changed", "detail": why, "chunk": idx}))

    def _send_piece(self, fd, at, want, h):
        self._pace(want)
        view = self.view
        if h is not None:
            # Hash from our buffer, send from the page cache: sendfile spares the copy to the pipe.
            n = _pread_into(fd, view[:want], at)
            if not n:
                return 0
            h.update(view[:n])
            want = n
        if self.sendfile:
            sent = 0
            try:
                while sent < want:
                    k = os.sendfile(1, fd, at + sent, want - sent)
                    if k == 0:
                        break
                    sent += k
                return sent
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS) or sent:
                    raise
                self.sendfile = False
        if h is None:
            want = _pread_into(fd, view[:want], at)
        _write_all(1, view[:want])
        return want

    def _pace(self, n):
        """--bwlimit: this stream's share of the rate, enforced here (the controller never sees the bytes)."""
        rate = self.spec.get("rate")
        if not rate:
            return
        now = time.time()
        self.next_slot = max(self.next_slot, now) + n / float(rate)
        delay = self.next_slot - now - 0.05  # allow a 50 ms burst
        if delay > 0:
            time.sleep(delay)

    def finish(self):
        if self.fd is None:
            return {"error": "open", "detail": "no file open"}
        spec = self.spec
        why = _changed(os.fstat(self.fd), spec, check_ino=False)
        if not why:
            try:
                why = _changed(os.stat(spec["path"]), spec)
            except OSError as exc:
                why = "it disappeared (%s)" % exc.strerror
        os.close(self.fd)
        self.fd = None
        digest = self.whole.hexdigest() if (self.whole is not None and self.hashed_to == spec["size"]) else None
        return {"error": "changed", "detail": why} if why else {"finished": True, "sha256": digest}


def _stream_reader():
    _big_pipes()
    _write_all(1, frame(REPLY, _hello()))
    inp = _In()
    reader = _Reader()
    while True:
        tag = inp.read_exact(1, eof_ok=True)
        if not tag:
            return 0
        if tag == FACTS:
            _write_all(1, frame(REPLY, source_facts(**inp.read_json())))
        elif tag == FORWARD:
            _write_all(1, inp.read_exact(inp.read_len()))
        elif tag == OPEN:
            _write_all(1, frame(REPLY, reader.open(inp.read_json())))
        elif tag == RANGE:
            code = reader.send_range(*struct.unpack(RANGE_FMT, inp.read_exact(struct.calcsize(RANGE_FMT))))
            if code is not None:
                return code
        elif tag == FINISH:
            _write_all(1, frame(REPLY, reader.finish()))
        else:
            sys.stderr.write("dfo-relay: protocol error (reader got %r)\n" % tag)
            return 2


# ----------------------------------------------------------------------------------- writer (destination host)

class _Partial(object):
    """The destination partial, open for writing at offsets. Bytes go from our stdin pipe into the file
    with splice(2) when the system has it (no copy through this process), and are hashed from a
    read-only mapping of what was just written, so the digest is of the file's content."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR | _NOFOLLOW)
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.close(self.fd)
            raise OSError(errno.EINVAL, "not a regular file")
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
        if self.map is not None:
            self.map.close()
        os.close(self.fd)


class _WriterFailed(Exception):
    """Say "error KIND MESSAGE" and stop with CODE."""

    def __init__(self, kind, message, code=1):
        Exception.__init__(self, message)
        self.kind, self.message, self.code = kind, message, code


class _Writer(object):
    def __init__(self):
        self.part = None
        self.jfd = None
        self.spec = {}  # type: dict  # the open file's: the controller's open command and the paths beside it
        self.whole = None
        self.whole_to = 0
        self.view = memoryview(bytearray(BUF))

    def command(self, op, args):
        """A sealed command from the controller; returns the reply line."""
        if op == "facts":
            reply = dest_facts(args["path"], args["rels"])
            if args.get("inside") and reply["kind"] in ("dir", "missing"):  # where a single file lands in a
                # folder: asked in the same trip
                reply["inside"] = dest_facts(_final(args["path"], args["inside"]), [""])
            return "facts " + json.dumps(reply)
        if op == "open":
            return self.open(args)
        if op == "finish":
            return self.finish()
        if op == "publish":
            return self.publish(args)
        raise _WriterFailed("protocol", "unknown writer command %r" % op, 2)

    def open(self, args):
        final = _final(args["root"], args["rel"])
        spec = dict(args, final=final, partial=final + PARTIAL_SUFFIX, journal=final + JOURNAL_SUFFIX)
        prepared = {}
        if args.get("prepare"):
            try:
                prepared = prepare_file(final, args["size"], **args["prepare"])
            except OSError as exc:
                full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
                free, where = _free_space(final)
                prepared = {"error": "nospace" if full else "open", "detail": "cannot prepare %s: %s "
                            "(%d bytes free at %s)" % (spec["partial"], exc.strerror, free, where)}
            if "error" in prepared:
                return "error %s %s" % (prepared["error"], prepared["detail"])
        try:
            self.part = _Partial(spec["partial"])
            self.jfd = os.open(spec["journal"], os.O_WRONLY | os.O_APPEND | _NOFOLLOW)
        except OSError as exc:
            raise _WriterFailed("open", "cannot open %s: %s" % (spec["partial"], exc.strerror)) from None
        fcntl.flock(self.part.fd, fcntl.LOCK_SH)  # tells a concurrent prepare_file that we are still writing
        self.spec = spec
        self.whole, self.whole_to = (hashlib.sha256() if spec["hash"] == "file" else None), 0
        return "opened " + json.dumps(prepared)

    def data(self, idx, offset, length, inp):
        """One chunk from the pipe into the partial; acknowledged with its sha256 (chunk mode)."""
        spec = self.spec
        if self.part is None or self.jfd is None or offset != idx * spec["chunk_size"] or offset >= spec["size"] or \
                length != min(spec["chunk_size"], spec["size"] - offset):
            raise _WriterFailed("protocol", "a data frame (chunk %d, %d bytes at %d) that does not fit the open "
                                "file" % (idx, length, offset), 2)
        h = hashlib.sha256() if spec["hash"] == "chunk" else None
        if self.whole is not None and offset != self.whole_to:
            self.whole = None
        hashers = [x for x in (h, self.whole) if x is not None]
        done, reported = 0, 0
        try:
            while done < length:
                n = self._write_piece(self.part, inp, offset + done, min(BUF, length - done))
                self.part.hash_range(hashers, offset + done, n)
                done += n
                if done - reported >= PROGRESS_EVERY and done < length:
                    reported = done
                    _say("at %d %d" % (idx, done))
        except OSError as exc:
            where = offset + done
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                free, measured = _free_space(spec["partial"])
                raise _WriterFailed("nospace", "no space left on device writing %s at offset %d (%d bytes free at "
                                    "%s)" % (spec["partial"], where, free, measured), EXIT_NOSPACE) from None
            raise _WriterFailed("io", "writing %s at offset %d: %s" % (spec["partial"], where, exc.strerror)) from None
        if self.whole is not None:
            self.whole_to = offset + length
        digest = h.hexdigest() if h is not None else "-"
        os.write(self.jfd, ("done %d %s\n" % (idx, digest)).encode())
        _say("ack %d %d %d %s" % (idx, offset, length, digest))

    def _write_piece(self, part, inp, at, want):
        if part.splice:
            try:
                n = os.splice(0, part.fd, want, offset_dst=at)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
                part.splice = False
                return self._write_piece(part, inp, at, want)
        else:
            n = inp.readinto(self.view[:want])
            written = 0
            while written < n:
                written += os.pwrite(part.fd, self.view[written:n], at + written)
        if not n:
            raise EOFError  # the stream went away mid-chunk: not journaled
        return n

    def finish(self):
        if self.part is None or self.jfd is None:
            raise _WriterFailed("protocol", "finish without an open file", 2)
        os.fsync(self.part.fd)
        self.part.close()
        os.close(self.jfd)
        self.part = self.jfd = None
        whole = self.whole if self.whole_to == self.spec["size"] else None
        return "end %s" % (whole.hexdigest() if whole is not None else "-")

    def publish(self, args):
        """Rename a verified partial into place and/or write the sidecar manifest (beside ROOT)."""
        done = {}
        if args.get("rel") is not None:
            done = finalize_file(_final(args["root"], args["rel"]), args["size"], args.get("mode"))
            if "error" in done:
                return "error %s %s" % (done["error"], done["detail"])
        if args.get("manifest") is not None:
            done["manifest"] = write_json(args["root"].rstrip("/") + MANIFEST_SUFFIX, args["manifest"])["path"]
        return "published " + json.dumps(done)


def _stream_writer(key):
    key = bytes(bytearray.fromhex(key))
    _big_pipes()
    _say("hello " + json.dumps(_hello()))
    inp = _In()
    writer = _Writer()
    seq = 0
    try:
        while True:
            tag = inp.read_exact(1, eof_ok=True)
            if not tag:
                return 0
            if tag == REPLY:
                body = inp.read_exact(inp.read_len())
                if b"\n" in body or b"\r" in body:
                    raise _WriterFailed("protocol", "a reply from the source with a line break in it", 2)
                _write_all(1, b"reader " + body + b"\n")
            elif tag == COMMAND:
                try:
                    op, args = unseal(key, inp.read_exact(inp.read_len()), seq)
                except ValueError as exc:
                    raise _WriterFailed("protocol", str(exc), 2) from None
                seq += 1
                try:
                    _say(writer.command(op, args))
                except RuntimeError as exc:  # _confine refused a name
                    raise _WriterFailed("refused", str(exc), 2) from None
            elif tag == DATA:
                writer.data(*(struct.unpack(RANGE_FMT, inp.read_exact(struct.calcsize(RANGE_FMT))) + (inp,)))
            else:
                raise _WriterFailed("protocol", "the writer got %r" % tag, 2)
    except _WriterFailed as exc:
        _say("error %s %s" % (exc.kind, exc.message.replace("\n", " ")))
        return exc.code


# ----------------------------------------------------------------------------------- whole-file hashers

def _follow_hash(root, rel, size):
    """Whole-file sha256 of the partial, hashed as the controller reports the contiguous done prefix
    ("OFFSET" lines); "end" means every chunk is written and fsynced by its writer."""
    partial = _final(root, rel) + PARTIAL_SUFFIX
    inp = os.fdopen(0, "rb")  # nothing else reads our stdin: buffered line reads are fine here
    view = memoryview(bytearray(BUF))
    h, pos = hashlib.sha256(), 0
    fd = os.open(partial, os.O_RDONLY | _NOFOLLOW)
    with os.fdopen(fd, "rb", buffering=0) as fh:
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
    view = memoryview(bytearray(BUF))
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
    # Typed as a plain dict: the four take different arguments, and their joined type is one mypy cannot call.
    funcs = {"reader": _stream_reader, "writer": _stream_writer, "follow": _follow_hash,
             "hash": _hash_source}  # type: dict
    try:
        code = funcs[kind](**kwargs)
    except (EOFError, BrokenPipeError):
        code = EXIT_ABORTED
    except Exception as exc:
        sys.stderr.write("dfo-relay %s: %s: %s\n" % (kind, type(exc).__name__, exc))
        code = 1
    sys.stdout.flush()
    os._exit(code)
