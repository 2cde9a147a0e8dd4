# The relay's wire protocol and file layout, shared by the controller and the host script.
#
# This module is imported by the controller and also sent to the hosts as part of the host program
# (transport/host_prelude.py + this file + relay/host_script.py), so it is stdlib only and parses as
# Python 3.6: no annotations, no f-strings.
#
# Streams. Each stream is a pair of host processes joined by one OS pipe on the controller:
#
#   controller --stdin--> READER (source host) --stdout == pipe--> WRITER (destination host) --stdout--> controller
#
# The controller's Python never touches file bytes: the reader's ssh writes them into the pipe and the
# writer's ssh reads them from it (the same path as `ssh src cat F | ssh dst 'cat > F'`). The pipe also
# carries the reader's replies and the controller's commands for the writer, each framed:
#
#   controller -> reader   FACTS  u32 len + JSON(source_facts kwargs)        -> a REPLY with the facts
#                          OPEN   u32 len + JSON{path,size,mtime_ns,ino,hash,rate}  -> a REPLY {ok} or {error}
#                          RANGE  RANGE_FMT(idx, offset, length)             -> DATA + bytes [+ REPLY {chunk,sha256}]
#                          FINISH                                            -> a REPLY {finished,sha256}
#                          FORWARD u32 len + bytes: copied unread to the pipe (a sealed writer COMMAND)
#   pipe (reader -> writer) REPLY  u32 len + JSON: passed on by the writer as the line "reader JSON"
#                          DATA   RANGE_FMT(idx, offset, length) + the bytes, written at offset
#                          COMMAND u32 len + 32-byte HMAC-SHA256 + JSON{seq,op,args}
#   writer -> controller   lines: "hello JSON", "reader JSON", "facts JSON", "opened JSON",
#                          "at IDX BYTES" (progress inside a chunk), "ack IDX OFFSET LENGTH SHA|-",
#                          "end SHA|-", "published JSON", "error KIND MESSAGE"
#
# The source host can put any bytes into the pipe. So the writer obeys only COMMANDs sealed with a key
# that the controller gave it directly (in its bootstrap, written into the pipe before the reader
# starts), in sequence (no replay); DATA frames must fit the open file's chunk grid; names are confined
# under the destination root on the writer itself; a REPLY with a newline is refused (no forged lines).
import hashlib
import hmac
import json
import struct

PARTIAL_SUFFIX = ".dfo-partial"
JOURNAL_SUFFIX = ".dfo-partial.state"
MANIFEST_SUFFIX = ".dfo-manifest.json"
JOURNAL_VERSION = 1
FAST_CIPHER = "aes128-gcm@openssh.com"

EXIT_ABORTED = 3    # the controller went away (EOF on stdin, broken pipe): not an error of the host
EXIT_NOSPACE = 28

BUF = 1 << 20
PROGRESS_EVERY = 4 << 20  # the writer reports progress inside a chunk this often
PIPE_SIZE = 1 << 20

FACTS = b"S"
OPEN = b"O"
RANGE = b"R"
FINISH = b"F"
FORWARD = b"X"
REPLY = b"K"
DATA = b"W"
COMMAND = b"C"

LEN_FMT = ">I"
RANGE_FMT = ">QQQ"
MAC_SIZE = 32


def frame(tag, obj):
    """TAG + u32 length + JSON body."""
    body = json.dumps(obj).encode()
    return tag + struct.pack(LEN_FMT, len(body)) + body


def range_frame(tag, idx, offset, length):
    return tag + struct.pack(RANGE_FMT, idx, offset, length)


def seal(key, seq, op, args):
    """A writer command the source host (which sees it pass) can neither forge nor replay."""
    body = json.dumps({"seq": seq, "op": op, "args": args}).encode()
    mac = hmac.new(key, body, hashlib.sha256).digest()
    return COMMAND + struct.pack(LEN_FMT, len(body) + MAC_SIZE) + mac + body


def forward(data):
    """Controller -> reader: pass DATA on to the writer unread."""
    return FORWARD + struct.pack(LEN_FMT, len(data)) + data


def unseal(key, payload, expect_seq):
    """(op, args) of a sealed command, or ValueError when it is forged, replayed or out of order."""
    mac, body = payload[:MAC_SIZE], payload[MAC_SIZE:]
    if not hmac.compare_digest(mac, hmac.new(key, body, hashlib.sha256).digest()):
        raise ValueError("a writer command with a bad seal (not from the controller)")
    doc = json.loads(body.decode())
    if doc.get("seq") != expect_seq:
        raise ValueError("a writer command out of sequence (%r, expected %d)" % (doc.get("seq"), expect_seq))
    return doc["op"], doc["args"]


def safe_mode(mode):
    """The permission bits a relayed file gets: never the source's bits as such (no setuid, no group or
    world write), only whether the owner could execute it."""
    return 0o755 if (mode or 0) & 0o100 else 0o644
