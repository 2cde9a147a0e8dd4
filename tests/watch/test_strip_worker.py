"""The resident strip worker on this machine (a real `strip-worker` process with torch, real checkpoints): its
checks on a request before it reads a byte, a strip handed over that equals the one-shot `strip-checkpoint`'s,
hostile requests answered with an error while it keeps serving, and the client's exit once it idled out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote_payload.errors import PayloadError
from remote_payload.models.strip_worker import checked_strip, strip_key
from remote_payload.resident import WORKER_GONE

REPO = Path(__file__).resolve().parents[2]


def _payload(*args: object, **kw) -> subprocess.Popen | subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "remote_payload", *map(str, args)]
    if kw.pop("background", False):
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _checkpoint(path: Path, seed: int = 0) -> Path:
    torch = pytest.importorskip("torch")
    from remote_payload.fixtures.models import DRAFTER_SPEC
    from remote_payload.models.drafter import DFlashDrafter
    from remote_payload.models.spec import from_training

    spec = {**DRAFTER_SPEC, "mask_token_id": 5}
    torch.manual_seed(seed)
    state = {k: v.detach().clone() for k, v in DFlashDrafter(from_training(spec, {}, "test")).state_dict().items()
             if not k.startswith("rotary_emb.")}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": state, "optimizer": {"state": {}, "param_groups": []}, "config": spec, "step": 7}, path)
    return path


def _out(strip_root: Path, src: Path) -> Path:
    st = src.stat()
    return strip_root / strip_key(str(src), st.st_size, st.st_mtime_ns)


@pytest.fixture
def roots(tmp_path):
    source, strip = tmp_path / "run7", tmp_path / "work" / "relay-strip"
    source.mkdir()
    strip.mkdir(parents=True)
    (source / "step_1.pt").write_bytes(b"a checkpoint")
    (tmp_path / "elsewhere.pt").write_bytes(b"another")
    os.symlink(tmp_path / "elsewhere.pt", source / "link.pt")
    (source / "sub").mkdir()
    return source, strip


def test_a_good_request_names_its_checkpoint_and_strip_folder(roots):
    source, strip = roots
    src = source / "step_1.pt"
    assert checked_strip({"src": str(src), "out": str(_out(strip, src))}, source_root=source, strip_root=strip) == \
        (src.resolve(), _out(strip, src).resolve())


@pytest.mark.parametrize("change, phrase", [
    ({"src": "{tmp}/elsewhere.pt"}, "is not inside"),               # not in the watched folder
    ({"src": "{source}/link.pt"}, "is not inside"),                 # a link in it that leaves it
    ({"src": "{source}/../elsewhere.pt"}, "is not inside"),
    ({"src": "{source}/sub"}, "not a regular file"),
    ({"src": "{source}/gone.pt"}, "cannot be read"),
    ({"src": "run7/step_1.pt"}, "not an absolute path"),
    ({"out": "/tmp/evil"}, "is not"),                               # outputs only STRIP_ROOT/KEY
    ({"out": "{strip}/0123456789abcdef"}, "the strip folder of"),   # another checkpoint's key
    ({"out": "{strip}/sub/../{key}x"}, "the strip folder of"),
    ({"out": "{strip}/../{key}"}, "is not"),
    ({"out": None}, "output folder is missing"),
])
def test_a_hostile_request_is_refused_before_anything_is_read(roots, tmp_path, change, phrase):
    source, strip = roots
    src = source / "step_1.pt"
    key = _out(strip, src).name
    doc = {"src": str(src), "out": str(_out(strip, src))}
    doc.update({k: v.format(tmp=tmp_path, source=source, strip=strip, key=key) if isinstance(v, str) else v
                for k, v in change.items()})
    with pytest.raises(PayloadError, match=phrase):
        checked_strip(doc, source_root=source, strip_root=strip)


def test_a_planted_link_at_the_strip_folder_is_refused(roots, tmp_path):
    source, strip = roots
    src = source / "step_1.pt"
    os.symlink(tmp_path, _out(strip, src))
    with pytest.raises(PayloadError, match="is a link"):
        checked_strip({"src": str(src), "out": str(_out(strip, src))}, source_root=source, strip_root=strip)
    with pytest.raises(PayloadError, match="expected an object"):
        checked_strip(["not", "a", "request"], source_root=source, strip_root=strip)


def _wait_ready(worker_dir: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        state = (worker_dir / "worker.json")
        if state.exists() and json.loads(state.read_text()).get("state") == "ready":
            return
        time.sleep(0.1)
    raise AssertionError("the strip worker did not get ready")


def test_the_worker_strips_as_the_one_shot_command_does_and_survives_hostile_requests(tmp_path):
    source, strip, worker_dir = tmp_path / "run7", tmp_path / "relay-strip", tmp_path / "job" / "worker"
    src = _checkpoint(source / "step_7.pt")
    proc = _payload("strip-worker", "--worker-dir", worker_dir, "--source-root", source, "--strip-root", strip,
                    "--idle-exit", "600", background=True)
    try:
        _wait_ready(worker_dir, proc)
        # A request the controller never made, with an output outside the strip folder: refused, nothing written.
        evil = tmp_path / "evil"
        bad = _payload("strip-handover", "--worker-dir", worker_dir, src, evil)
        assert bad.returncode == 2 and not evil.exists()
        assert bad.stderr.startswith("dfo-payload error: strip request: output") and "\n" not in bad.stderr.strip()
        outside = _checkpoint(tmp_path / "other" / "step_8.pt", seed=1)
        bad = _payload("strip-handover", "--worker-dir", worker_dir, outside, _out(strip, outside))
        assert bad.returncode == 2 and "is not inside" in bad.stderr and not _out(strip, outside).exists()
        # A request file with no reply path a client could wait on is dropped; the worker goes on.
        (worker_dir / "inbox" / "..json").write_text("{}")
        (worker_dir / "inbox" / "x y.json").write_text(json.dumps({"src": str(src), "out": str(evil)}))

        good = _payload("strip-handover", "--worker-dir", worker_dir, src, _out(strip, src))
        assert good.returncode == 0, good.stderr
        assert "by the resident strip worker" in good.stdout
        served = json.loads((worker_dir / "worker.json").read_text())
        assert served["state"] == "ready" and served["pid"] == proc.pid and served["last"]["ok"]
        record = json.loads((_out(strip, src) / "dfo-source.json").read_text())
        assert not list(strip.glob(".*")) and not list((worker_dir / "outbox").iterdir())  # no leftovers

        one_shot = _payload("strip-checkpoint", src, tmp_path / "one-shot")
        assert one_shot.returncode == 0, one_shot.stderr
        expected = json.loads((tmp_path / "one-shot" / "dfo-source.json").read_text())
        assert {k: v for k, v in record.items() if k != "stripped_utc"} == \
            {k: v for k, v in expected.items() if k != "stripped_utc"}
        assert (_out(strip, src) / "model.safetensors").read_bytes() == \
            (tmp_path / "one-shot" / "model.safetensors").read_bytes()
    finally:
        proc.kill()
        proc.wait()
    # A worker that is gone: the client says so with WORKER_GONE and leaves no request behind.
    gone = _payload("strip-handover", "--worker-dir", worker_dir, src, _out(strip, src))
    assert gone.returncode == WORKER_GONE and "worker gone" in gone.stderr
    assert not [p for p in (worker_dir / "inbox").glob("*.json") if p.name[0].isalnum()]


def test_the_worker_stops_after_its_idle_time(tmp_path):
    worker_dir = tmp_path / "worker"
    proc = _payload("strip-worker", "--worker-dir", worker_dir, "--source-root", tmp_path, "--strip-root",
                    tmp_path / "relay-strip", "--idle-exit", "1", background=True)
    assert proc.wait(timeout=240) == 0
    assert json.loads((worker_dir / "worker.json").read_text())["state"] == "stopped"
    bad = _payload("strip-worker", "--worker-dir", worker_dir, "--source-root", tmp_path, "--strip-root",
                   tmp_path, "--idle-exit", "0")
    assert bad.returncode == 2 and "--idle-exit must be more than 0" in bad.stderr
