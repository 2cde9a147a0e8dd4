# Host side of `dfo watch`'s proxies (orchestrator/watch/proxies.py): the trainer's own numbers where it
# already logged them, read on the training host. Stdlib only, Python >= 3.8 (the host has no tensorboard
# package): TensorBoard event files (TFRecord framing with its masked crc32c; the Event and Summary protobuf
# messages decoded by hand for scalar values), trainer_state.json's log_history and JSONL metric logs. It
# only reads, and reads at most MAX_BYTES per file and MAX_RECORDS values per tag; the controller checks
# every field of the answer again (proxies.parse_proxies).
import json
import math
import os
import stat
import struct

MAX_DEPTH = 2    # folders read below the logdir (a trainer's logdir/tb/, logdir/checkpoint-N/)
MAX_DIRS = 256   # folders listed at most: a walk never runs through a whole filesystem

_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def _crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data):
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(buf, pos):
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf):
    """(field number, wire type, value) of a protobuf message; value is an int or a bytes slice."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError("unsupported wire type %d" % wire)
        if pos > len(buf):
            raise ValueError("truncated field")
        yield number, wire, value


def _tensor_scalar(buf):
    """The first float of a TensorProto (DT_FLOAT or DT_DOUBLE: float_val, double_val or tensor_content)."""
    dtype, content = 1, None
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 0:
            dtype = value
        elif number == 4 and wire == 2:
            content = value
        elif number == 5:   # float_val: packed (wire 2) or one fixed32
            if len(value) >= 4:
                return struct.unpack("<f", value[:4])[0]
        elif number == 6:
            if len(value) >= 8:
                return struct.unpack("<d", value[:8])[0]
    if content is not None:
        if dtype == 1 and len(content) >= 4:
            return struct.unpack("<f", content[:4])[0]
        if dtype == 2 and len(content) >= 8:
            return struct.unpack("<d", content[:8])[0]
    return None


def _event_scalars(record):
    """(step, [(tag, value)]) of one Event record holding a Summary."""
    step, values = 0, []
    for number, wire, value in _fields(record):
        if number == 2 and wire == 0:
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 5 and wire == 2:
            for vnum, vwire, summary_value in _fields(value):
                if vnum != 1 or vwire != 2:
                    continue
                tag, number_value = None, None
                for fnum, fwire, field in _fields(summary_value):
                    if fnum == 1 and fwire == 2:
                        tag = bytes(field).decode("utf-8", "replace")
                    elif fnum == 2 and fwire == 5:
                        number_value = struct.unpack("<f", field)[0]
                    elif fnum == 8 and fwire == 2:
                        number_value = _tensor_scalar(field)
                if tag is not None and number_value is not None:
                    values.append((tag, number_value))
    return step, values


def _read_regular(path, max_bytes):
    """The first MAX_BYTES of the regular file PATH; OSError for anything else (a link is never followed, and a
    FIFO or device is opened non-blocking and refused by fstat before any read: it cannot hang the reader)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError("%s is not a regular file" % path)
        return f.read(max_bytes)


def read_event_file(path, max_bytes):
    """[(tag, step, value)] from a TensorBoard event file; stops at the first bad or torn record (a
    trainer may be writing the file right now)."""
    data = _read_regular(path, max_bytes)
    out: list = []
    pos = 0
    while pos + 12 <= len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if _masked_crc(header) != header_crc or pos + 12 + length + 4 > len(data):
            break
        record = data[pos + 12:pos + 12 + length]
        (record_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if _masked_crc(record) != record_crc:
            break
        pos += 16 + length
        try:
            step, values = _event_scalars(record)
        except (ValueError, struct.error):
            continue
        out.extend((tag, step, value) for tag, value in values)
    return out


def _log_rows(rows, step_key="step"):
    out = []
    for row in rows:
        if not isinstance(row, dict):
            continue
        step = row.get(step_key, row.get("global_step", row.get("step")))
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "global_step"):
                out.append((key, step, float(value)))
    return out


def _read_jsonl(path, max_bytes):
    data = _read_regular(path, max_bytes)
    rows = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a torn last line, or not a metrics line
    return _log_rows(rows)


def _walk(logdir, max_dirs=MAX_DIRS):
    """(folder, sorted file names) of LOGDIR and the folders at most MAX_DEPTH below it, at most MAX_DIRS in all.
    Lazy: os.walk descends only into the folders left in ``dirs`` after each step (links are not followed)."""
    base_depth = logdir.rstrip("/").count("/")
    listed = 0
    for root, dirs, names in os.walk(logdir):
        listed += 1
        if listed > max_dirs:
            return
        dirs.sort()
        if root.rstrip("/").count("/") - base_depth >= MAX_DEPTH:
            dirs[:] = []
        yield root, sorted(names)


def _trainer_state(candidates, prefer, logdir, max_bytes):
    """The trainer_state.json to read: the one in a PREFER folder (the checkpoint's own), else the logdir's
    own, else the newest of CANDIDATES (found in the walk); None when there is none."""
    for folder in list(prefer) + [logdir]:
        path = os.path.join(folder, "trainer_state.json")
        if path in candidates or (folder in prefer and os.path.isfile(path) and not os.path.islink(path)):
            return path
    newest = []
    for path in candidates:
        try:
            newest.append((os.lstat(path).st_mtime, path))
        except OSError:
            continue
    return max(newest)[1] if newest else None


def read_proxies(logdir, tags, max_bytes, max_records, max_files=64, prefer=()):
    """The values of TAGS logged under LOGDIR: {"series": {tag: [[step, value, file], …]}, "files": […],
    "sources": {tag: "tensorboard" | "trainer_state.json" | "jsonl"}} (FILE: the index in "files" of the file
    the value was read from).

    Event files, one trainer_state.json (its log_history holds the whole run: the one in a PREFER folder, the
    checkpoint's own, else the logdir's, else the newest found) and *.jsonl files, at most MAX_DEPTH folders
    down (a lazy walk of at most MAX_DIRS folders); regular files only; each tag keeps its last MAX_RECORDS
    values by step."""
    wanted = set(tags)
    found: dict = {}
    kinds: dict = {}  # tag -> the kind of log it was last read from
    files: list = []
    states = []
    if not os.path.isdir(logdir):  # os.walk would say nothing
        return {"error": "%s is not a folder on this host" % logdir}

    def take(rows, kind, path):
        files.append(os.path.relpath(path, logdir) if path.startswith(logdir.rstrip("/") + "/") else path)
        for tag, step, value in rows:
            if tag in wanted:
                found.setdefault(tag, {})[step] = (value, len(files) - 1)
                kinds[tag] = kind

    for root, names in _walk(logdir):
        for name in names:
            path = os.path.join(root, name)
            if os.path.islink(path) or len(files) >= max_files:
                continue
            try:
                if name.startswith("events.out.tfevents."):
                    rows, kind = read_event_file(path, max_bytes), "tensorboard"
                elif name == "trainer_state.json":
                    states.append(path)
                    continue
                elif name.endswith(".jsonl"):
                    rows, kind = _read_jsonl(path, max_bytes), "jsonl"
                else:
                    continue
            except OSError:
                continue
            take(rows, kind, path)
    path = _trainer_state(states, [os.path.normpath(p) for p in prefer if isinstance(p, str)], logdir, max_bytes)
    if path is not None:
        try:
            state = json.loads(_read_regular(path, max_bytes + 1).decode("utf-8"))
        except (OSError, ValueError):
            state = None
        if isinstance(state, dict) and isinstance(state.get("log_history"), list):
            take(_log_rows(state["log_history"]), "trainer_state.json", path)
    series = {}
    for tag, by_step in found.items():
        rows = sorted((s, v, f) for s, (v, f) in by_step.items() if isinstance(v, float) and math.isfinite(v))
        series[tag] = [[s, v, f] for s, v, f in rows[-max_records:]]
    return {"logdir": logdir, "series": series, "files": files,
            "sources": {tag: kinds[tag] for tag in series}}
