"""Pure planning of `dfo relay-checkpoint` (orchestrator/relay/plan.py): no hosts involved."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import parse_inventory
from orchestrator.relay.plan import (
    FAST_CIPHER,
    MAX_CHUNK,
    MAX_STREAMS,
    MIN_CHUNK,
    Endpoint,
    FilePlan,
    GiB,
    MiB,
    check_space,
    choose_chunk_size,
    choose_streams,
    chunk_ranges,
    cipher_choice,
    destination_path,
    first_gap,
    human_bytes,
    is_sequential,
    journal_header,
    manifest_path,
    parse_endpoint,
    plan_file,
    resume_verdict,
    space_needed,
    to_send,
)

INVENTORY = """
hosts:
  kpro6:
    address: 10.0.0.1
    workdir: /srv/dfo
    paths: {checkpoints: /data/ckpt}
  ct129:
    address: 10.0.0.2
    workdir: /srv/dfo
"""


@pytest.fixture
def inv():
    return parse_inventory(INVENTORY, Path("inv.yaml"))


IDENT = {"size": 10 * MiB, "mtime_ns": 1_700_000_000_000_000_000, "ino": 42, "mode": 0o644}


def journal(done: list[int], ident=IDENT, chunk=4 * MiB, host="kpro6", path="/data/ckpt/a.pt") -> dict:
    header = journal_header(host, path, ident, chunk)
    return {"header": header, "done": {str(i): None for i in done}}


# ----------------------------------------------------------------------------------- endpoints


def test_parse_endpoint_absolute_relative_and_trailing_slash(inv):
    assert parse_endpoint("kpro6:/data/x.pt", inv, "source") == Endpoint("kpro6", "/data/x.pt")
    assert parse_endpoint("kpro6:step 1.pt", inv, "source").path == "/data/ckpt/step 1.pt"
    dst = parse_endpoint("ct129:/models/", inv, "destination")
    assert dst.path == "/models" and dst.trailing_slash
    # Everything after the first ':' is the path, colons included.
    assert parse_endpoint("ct129:/a:b/c", inv, "destination").path == "/a:b/c"


@pytest.mark.parametrize("text, needle", [
    ("kpro6", "expected HOST:PATH"),
    (":/x", "expected HOST:PATH"),
    ("kpro6:", "empty"),
    ("nosuch:/x", "unknown host 'nosuch'"),
    ("ct129:rel/x", "no paths.checkpoints"),
    ("kpro6:/", "refusing"),
    ("kpro6:/a\nb", "newline"),
])
def test_parse_endpoint_rejects_bad_input(inv, text, needle):
    with pytest.raises(InputError) as err:
        parse_endpoint(text, inv, "source")
    assert needle in str(err.value)


def test_destination_path_follows_cp_rules():
    plain = Endpoint("ct129", "/models/x.pt")
    slash = Endpoint("ct129", "/models", trailing_slash=True)
    assert destination_path(plain, "/data/a.pt", "file", "missing") == "/models/x.pt"
    assert destination_path(slash, "/data/a.pt", "file", "missing") == "/models/a.pt"
    # An existing directory as the target of a file: the file goes inside it.
    assert destination_path(Endpoint("ct129", "/models"), "/data/a.pt", "file", "dir") == "/models/a.pt"
    # A directory source names the destination directory itself unless a '/' asks for "inside".
    assert destination_path(Endpoint("ct129", "/m/run1"), "/data/run1", "dir", "dir") == "/m/run1"
    assert destination_path(slash, "/data/run1", "dir", "dir") == "/models/run1"
    # rsync's convention: a source directory with a trailing '/' means its contents, which land in DST.
    run7 = Endpoint("ct129", "/ckpt/run7", trailing_slash=True)
    assert destination_path(run7, "/data/run7", "dir", "missing", source_slash=True) == "/ckpt/run7"
    assert destination_path(run7, "/data/run7", "dir", "missing") == "/ckpt/run7/run7"
    # Stripped checkpoints become a folder named after the checkpoint.
    assert destination_path(slash, "/data/step_9.pt", "dir", "dir", strip=True) == "/models/step_9-weights"
    assert manifest_path("/models/a.pt") == "/models/a.pt.dfo-manifest.json"


# ----------------------------------------------------------------------------------- sizing


def test_chunk_size_is_a_power_of_two_between_bounds():
    assert choose_chunk_size(0) == MIN_CHUNK
    assert choose_chunk_size(10 * MiB) == 4 * MiB
    assert choose_chunk_size(GiB) == 16 * MiB
    assert choose_chunk_size(17 * 10**9) == MAX_CHUNK
    for size in (1, 5 * MiB, 3 * GiB, 100 * GiB):
        c = choose_chunk_size(size)
        assert c & (c - 1) == 0 and MIN_CHUNK <= c <= MAX_CHUNK


def test_chunk_ranges_cover_the_file_exactly():
    ranges = chunk_ranges(10 * MiB + 3, 4 * MiB)
    assert ranges == [(0, 4 * MiB), (4 * MiB, 4 * MiB), (8 * MiB, 2 * MiB + 3)]
    assert chunk_ranges(0, 4 * MiB) == []
    assert sum(n for _, n in chunk_ranges(12345678, 4 * MiB)) == 12345678


def test_streams_by_size_cores_and_request():
    assert choose_streams(10 * MiB, None, cpu_count=16) == 1
    assert choose_streams(512 * MiB, None, cpu_count=16) == 2
    assert choose_streams(17 * GiB, None, cpu_count=16) == 4
    assert choose_streams(17 * GiB, None, cpu_count=4) == 2    # two ssh processes per stream here
    assert choose_streams(17 * GiB, None, cpu_count=2) == 1
    assert choose_streams(1, 3, cpu_count=2) == 3               # an explicit request wins
    assert choose_streams(1, 99, cpu_count=2) == MAX_STREAMS
    with pytest.raises(InputError):
        choose_streams(1, 0)


# ----------------------------------------------------------------------------------- per file


def plan(dest_entry: dict, ident=IDENT) -> FilePlan:
    return plan_file("", "kpro6", "/data/ckpt/a.pt", ident, "/models/a.pt", dest_entry)


def test_plan_fresh_file_sends_everything():
    p = plan({"final": None, "partial": None, "journal": None})
    assert p.action == "send" and not p.reset and p.claimed == []
    assert p.partial == "/models/a.pt.dfo-partial" and p.journal == "/models/a.pt.dfo-partial.state"
    assert len(p.chunks) == 3


def test_plan_resumes_from_a_matching_journal():
    p = plan({"final": None, "partial": {"size": 10 * MiB, "allocated": 10 * MiB}, "journal": journal([0, 2])})
    assert p.action == "resume" and p.claimed == [0, 2] and not p.reset
    assert p.claimed_bytes == 4 * MiB + 2 * MiB
    assert space_needed([p]) == 0  # the partial is already allocated


def test_plan_restarts_when_the_source_changed_since_the_partial():
    newer = dict(IDENT, mtime_ns=IDENT["mtime_ns"] + 1)
    p = plan({"final": None, "partial": {"size": 10 * MiB, "allocated": 10 * MiB}, "journal": journal([0, 1])},
             ident=newer)
    assert p.action == "send" and p.reset and p.claimed == []
    assert space_needed([p]) == 10 * MiB


def test_plan_restarts_on_a_partial_without_journal_or_of_the_wrong_size():
    assert plan({"final": None, "partial": {"size": 10 * MiB, "allocated": 0}, "journal": None}).reset
    assert plan({"final": None, "partial": {"size": 5, "allocated": 0}, "journal": journal([0])}).reset


def test_plan_same_size_final_is_compared_and_different_size_replaced():
    p = plan({"final": {"size": 10 * MiB, "mtime_ns": 1}, "partial": None, "journal": None})
    assert p.action == "compare"
    q = plan({"final": {"size": 3, "mtime_ns": 1}, "partial": None, "journal": None})
    assert q.action == "send" and q.replaces
    with pytest.raises(InputError):
        plan({"final": {"not_file": True}, "partial": None, "journal": None})


def test_resume_verdict_keeps_only_agreeing_chunks():
    good, bad = resume_verdict([0, 3, 5], ["a", "b", "c"], ["a", "X", "c"])
    assert good == [0, 5] and bad == [3]
    with pytest.raises(ValueError):
        resume_verdict([0], ["a"], [])


def test_to_send_and_sequential_mode():
    p = plan({"final": None, "partial": None, "journal": None})
    assert to_send(p, [1]) == [0, 2]
    assert is_sequential(p, [0, 1, 2], streams=1)
    assert not is_sequential(p, [0, 1, 2], streams=2)   # chunks interleave across streams
    assert not is_sequential(p, [0, 2], streams=1)      # a resume: not the whole file in order
    small = plan_file("", "kpro6", "/x", dict(IDENT, size=100), "/y", {})
    assert is_sequential(small, [0], streams=4)         # one chunk is always in order


def test_first_gap():
    assert first_gap({0, 1, 2, 5}, 0) == 3
    assert first_gap(set(), 0) == 0
    assert first_gap({4}, 4) == 5


# ----------------------------------------------------------------------------------- space, cipher, rates


def test_space_check_message_names_host_path_and_sizes():
    assert check_space("ct129", "/models/a.pt", 100, 100) is None
    msg = check_space("ct129", "/models/a.pt", 40 * MiB, 8 * MiB)
    assert msg and "ct129" in msg and "/models/a.pt" in msg and "40.0 MiB" in msg and "8.0 MiB" in msg


def test_cipher_choice():
    clients = ["aes128-ctr", FAST_CIPHER, "chacha20-poly1305@openssh.com"]
    assert cipher_choice(None, clients, {"kpro6": True, "ct129": True})[0] == FAST_CIPHER
    cipher, why = cipher_choice(None, clients, {"kpro6": True, "ct129": False})
    assert cipher is None and "ct129" in why
    assert cipher_choice(None, ["aes128-ctr"], {})[0] is None
    assert cipher_choice("aes128-ctr", clients, {}) == ("aes128-ctr", "as requested with --cipher")
    with pytest.raises(InputError):
        cipher_choice("rot13", clients, {})


def test_human_bytes():
    assert human_bytes(512) == "512 B"
    assert human_bytes(40 * MiB) == "40.0 MiB"
    assert human_bytes(17 * GiB) == "17.0 GiB"


# ----------------------------------------------------------------------------------- host-side code


def test_host_code_and_bootstrap_parse_as_python_36():
    """Hosts may only have an old python3: the code sent to them must not use newer syntax."""
    import ast

    from orchestrator.relay import processes as relay_streams

    source = relay_streams.host_source().decode()
    ast.parse(source, feature_version=(3, 6))
    ast.parse(relay_streams.BOOT, feature_version=(3, 6))
    assert "\n" not in relay_streams.BOOT  # one line: any login shell passes it through


def test_stream_prelude_is_length_prefixed_code_ending_in_the_call():
    from orchestrator.relay import processes as relay_streams

    prelude = relay_streams.stream_prelude("writer", {"a": "it's \"x\" $(y)"})
    n = int(prelude[:10])
    code = prelude[10:]
    assert n == len(code)
    assert code.rstrip().endswith(b")") and b"_dfo_stream('writer'" in code
    compile(code, "prelude", "exec")
