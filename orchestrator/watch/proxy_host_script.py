# Host side of `dfo watch`'s proxies (orchestrator/watch/proxies.py): the trainer's own numbers where it
# already logged them, read on the training host. Stdlib only, Python >= 3.8 (the host has no tensorboard
# package): TensorBoard event files (TFRecord framing with its masked crc32c; the Event and Summary protobuf
# messages decoded by hand for scalar values), trainer_state.json's log_history and JSONL metric logs. It
# only reads, and reads at most MAX_BYTES per file and MAX_RECORDS values per tag; the controller checks
# every field of the answer again (proxies.parse_proxies).
import json
import math
import os
import struct

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


def read_event_file(path, max_bytes):
    """[(tag, step, value)] from a TensorBoard event file; stops at the first bad or torn record (a
    trainer may be writing the file right now)."""
    with open(path, "rb") as f:
        data = f.read(max_bytes)
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
    with open(path, "rb") as f:
        data = f.read(max_bytes)
    rows = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a torn last line, or not a metrics line
    return _log_rows(rows)


def read_proxies(logdir, tags, max_bytes, max_records, max_files=64):
    """The values of TAGS logged under LOGDIR: {"series": {tag: [[step, value], …]}, "files": […],
    "sources": {tag: "tensorboard" | "trainer_state.json" | "jsonl"}}.

    Event files, trainer_state.json (the newest: its log_history holds the whole run) and *.jsonl files,
    at most two folders down; each tag keeps its last MAX_RECORDS values by step."""
    wanted = set(tags)
    found: dict = {}
    kinds: dict = {}  # tag -> the kind of log it was last read from
    files: list = []
    states = []
    if not os.path.isdir(logdir):  # os.walk would say nothing
        return {"error": "%s is not a folder on this host" % logdir}
    base_depth = logdir.rstrip("/").count("/")
    try:
        walk = list(os.walk(logdir))
    except OSError as exc:
        return {"error": "cannot list %s: %s" % (logdir, exc)}
    for root, dirs, names in walk:
        if root.rstrip("/").count("/") - base_depth >= 2:
            dirs[:] = []
        for name in sorted(names):
            path = os.path.join(root, name)
            if os.path.islink(path) or len(files) >= max_files:
                continue
            try:
                if name.startswith("events.out.tfevents."):
                    rows, kind = read_event_file(path, max_bytes), "tensorboard"
                elif name == "trainer_state.json":
                    states.append((os.stat(path).st_mtime, path))
                    continue
                elif name.endswith(".jsonl"):
                    rows, kind = _read_jsonl(path, max_bytes), "jsonl"
                else:
                    continue
            except OSError:
                continue
            files.append(os.path.relpath(path, logdir))
            for tag, step, value in rows:
                if tag in wanted:
                    found.setdefault(tag, {})[step] = value
                    kinds[tag] = kind
    if states:
        path = max(states)[1]
        if os.path.getsize(path) <= max_bytes:
            try:
                with open(path, encoding="utf-8") as f:
                    state = json.load(f)
            except (OSError, ValueError):
                state = None
            if isinstance(state, dict) and isinstance(state.get("log_history"), list):
                files.append(os.path.relpath(path, logdir))
                for tag, step, value in _log_rows(state["log_history"]):
                    if tag in wanted:
                        found.setdefault(tag, {})[step] = value
                        kinds[tag] = "trainer_state.json"
    series = {}
    for tag, by_step in found.items():
        pairs = sorted((s, v) for s, v in by_step.items() if isinstance(v, float) and math.isfinite(v))
        series[tag] = [[s, v] for s, v in pairs[-max_records:]]
    return {"logdir": logdir, "series": series, "files": files,
            "sources": {tag: kinds[tag] for tag in series}}
