"""`dfo relay-checkpoint` against real sshd hosts (kpro6 -> controller -> ct129).

Files are a few MiB; tests that must interrupt a relay half-way slow it with --bwlimit and watch the
destination's journal (the sandbox hosts share this machine's filesystem), so nothing depends on timing.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest
from cli_runner import dfo, dfo_argv, dfo_env
from waiting import wait_for

from orchestrator.core.errors import DfoError, HostError, OperationError
from orchestrator.core.inventory import load_inventory
from orchestrator.relay.operation import RelayOptions, relay
from orchestrator.transport import Connector

pytestmark = pytest.mark.sshd
MiB = 1 << 20
CHUNK = 4 * MiB  # the chunk size relay/plan.py picks for files under 256 MiB


# ----------------------------------------------------------------------------------- helpers


def relay_json(box, src: str, dst: str, *args: str, inventory: Path | None = None) -> dict:
    proc = dfo(box, "relay-checkpoint", src, dst, "--json", *args, inventory=inventory)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def random_file(path: Path, size: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return sha(path)


def done_chunks(journal: Path) -> int:
    try:
        return sum(1 for line in journal.read_text().splitlines() if line.startswith("done "))
    except OSError:
        return 0


def start_relay(box, src: str, dst: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(dfo_argv("relay-checkpoint", src, dst, "--json", *args), env=dfo_env(box.inventory_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def paths(sandbox, request):
    """Per-test source and destination directories on the session sandbox's hosts."""
    name = request.node.name.replace("[", "_").replace("]", "")
    src = sandbox.hosts["kpro6"].checkpoints / name
    dst = sandbox.hosts["ct129"].checkpoints / name
    src.mkdir(parents=True, exist_ok=True)
    dst.mkdir(parents=True, exist_ok=True)
    return src, dst


# ----------------------------------------------------------------------------------- the happy paths


def test_single_file_both_hosts_digests_agree_manifest_and_skip_on_rerun(sandbox, paths):
    src, dst = paths
    digest = random_file(src / "step_100.pt", 9 * MiB + 123)
    out = relay_json(sandbox, f"kpro6:{src}/step_100.pt", f"ct129:{dst}/")
    final = dst / "step_100.pt"
    assert out["destination"] == f"ct129:{final}"
    assert sha(final) == digest == out["sha256"]
    d = out["digests"]
    # One stream, fresh: the source host hashed what it read, the destination what it wrote; the controller
    # never saw the bytes (they went from one ssh to the other through a pipe), so it has no digest of its own.
    assert d["source"] == d["destination"] == digest and d["in_flight"] is None
    assert out["files"][0]["mode"] == "sequential" and out["sent_bytes"] == final.stat().st_size
    assert out["cipher"] == "aes128-gcm@openssh.com" and out["data_plane"] == "ssh"
    manifest = json.loads((dst / "step_100.pt.dfo-manifest.json").read_text())
    assert manifest["sha256"] == digest and manifest["source"] == f"kpro6:{src}/step_100.pt"
    assert not list(dst.glob("*.dfo-partial*"))
    assert oct(final.stat().st_mode & 0o777) == oct((src / "step_100.pt").stat().st_mode & 0o777)

    again = relay_json(sandbox, f"kpro6:{src}/step_100.pt", f"ct129:{dst}/")
    assert again["files"][0]["status"] == "skipped" and again["sent_bytes"] == 0
    assert again["skipped_bytes"] == final.stat().st_size and again["sha256"] == digest


def test_parallel_streams_check_every_chunk_on_both_hosts(sandbox, paths):
    src, dst = paths
    digest = random_file(src / "big.bin", 6 * CHUNK + 5)
    out = relay_json(sandbox, f"kpro6:{src}/big.bin", f"ct129:{dst}/big.bin", "--streams", "3")
    f = out["files"][0]
    assert f["mode"] == "parallel" and f["streams"] == 3 and out["streams"] == 3
    assert f["chunks_checked_in_flight"] == f["chunks"] == 7
    assert out["digests"]["source"] == out["digests"]["destination"] == digest == sha(dst / "big.bin")


def test_directory_with_awkward_names_then_only_changes_move(sandbox, paths):
    src, dst = paths
    tree = src / "ckpt dir; $(touch pwned)"
    files = {
        "model-00001-of-00002.safetensors": 3 * MiB,
        "sub dir/it's \"quoted\" & `ticked`.bin": 1 * MiB + 7,
        "sub dir/$HOME|*?.json": 11,
        "empty.txt": 0,
    }
    digests = {rel: random_file(tree / rel, size) for rel, size in files.items()}
    out = relay_json(sandbox, f"kpro6:{tree}", f"ct129:{dst}/")
    landed = dst / tree.name
    assert out["kind"] == "dir" and out["destination"] == f"ct129:{landed}"
    for rel, digest in digests.items():
        assert sha(landed / rel) == digest, rel
    assert not (Path.cwd() / "pwned").exists() and not (landed / "pwned").exists()
    manifest = json.loads((dst / (tree.name + ".dfo-manifest.json")).read_text())
    assert {rel: m["sha256"] for rel, m in manifest["files"].items()} == digests

    # Change one file: only it moves, the identical ones are skipped after a sha256 comparison.
    digests["sub dir/$HOME|*?.json"] = random_file(tree / "sub dir/$HOME|*?.json", 12)
    again = relay_json(sandbox, f"kpro6:{tree}", f"ct129:{dst}/")
    status = {f["rel"]: f["status"] for f in again["files"]}
    assert status.pop("sub dir/$HOME|*?.json") == "sent"
    assert set(status.values()) == {"skipped"}
    assert again["sent_bytes"] == 12
    assert sha(landed / "sub dir/$HOME|*?.json") == digests["sub dir/$HOME|*?.json"]

    # A trailing '/' on the source relays its contents into the destination itself (rsync's convention).
    flat = relay_json(sandbox, f"kpro6:{tree}/", f"ct129:{dst}/flat/")
    assert flat["destination"] == f"ct129:{dst}/flat"
    assert sha(dst / "flat" / "model-00001-of-00002.safetensors") == digests["model-00001-of-00002.safetensors"]


def test_dry_run_moves_nothing_and_reports_the_plan(sandbox, paths):
    src, dst = paths
    random_file(src / "a.bin", 2 * MiB)
    out = relay_json(sandbox, f"kpro6:{src}/a.bin", f"ct129:{dst}/a.bin", "--dry-run")
    assert out["dry_run"] and out["files"][0]["status"] == "would-send" and out["sent_bytes"] == 0
    assert out["cipher"] == "aes128-gcm@openssh.com" and out["space_needed"] == 2 * MiB
    assert list(dst.iterdir()) == []


def test_quiet_when_not_a_tty_and_bad_input_is_exit_2(sandbox, paths):
    src, dst = paths
    random_file(src / "q.bin", MiB)
    ok = dfo(sandbox, "relay-checkpoint", f"kpro6:{src}/q.bin", f"ct129:{dst}/q.bin")
    assert ok.returncode == 0 and ok.stderr == ""  # no progress bar noise in logs
    assert "moved 1.0 MiB" in ok.stdout

    missing = dfo(sandbox, "relay-checkpoint", f"kpro6:{src}/nope.pt", f"ct129:{dst}/x")
    assert missing.returncode == 2 and f"source kpro6:{src}/nope.pt does not exist" in missing.stderr
    unknown = dfo(sandbox, "relay-checkpoint", f"kpro7:{src}/q.bin", f"ct129:{dst}/x")
    assert unknown.returncode == 2 and "unknown host 'kpro7'" in unknown.stderr and "kpro6" in unknown.stderr
    (dst / "afile").write_bytes(b"x")
    clash = dfo(sandbox, "relay-checkpoint", f"kpro6:{src}", f"ct129:{dst}/afile")
    # (the message names the full path: a long one wraps, so compare words)
    assert clash.returncode == 2 and "is a file, but the source is a directory" in " ".join(clash.stderr.split())
    for out in (missing, unknown, clash):
        assert "Traceback" not in out.stderr


# ----------------------------------------------------------------------------------- interruptions and resume


def test_sigkill_mid_relay_then_resume_moves_only_the_remainder(sandbox, paths):
    src, dst = paths
    size = 6 * CHUNK + 99
    digest = random_file(src / "ck.pt", size)
    journal = dst / "ck.pt.dfo-partial.state"
    proc = start_relay(sandbox, f"kpro6:{src}/ck.pt", f"ct129:{dst}/ck.pt", "--bwlimit", "6M")
    wait_for(lambda: done_chunks(journal) >= 2, "two chunks journaled", timeout=60, proc=proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert not (dst / "ck.pt").exists() and (dst / "ck.pt.dfo-partial").exists()

    out = relay_json(sandbox, f"kpro6:{src}/ck.pt", f"ct129:{dst}/ck.pt")
    f = out["files"][0]
    assert f["status"] == "resumed" and f["bad_chunks"] == 0
    assert out["resumed_bytes"] >= 2 * CHUNK
    assert out["sent_bytes"] + out["resumed_bytes"] == size  # only the remainder moved
    assert sha(dst / "ck.pt") == digest == out["sha256"] == out["digests"]["source"]
    assert not journal.exists()


def test_flipped_byte_in_the_partial_is_detected_and_sent_again(sandbox, paths):
    src, dst = paths
    size = 5 * CHUNK
    digest = random_file(src / "ck.pt", size)
    journal, partial = dst / "ck.pt.dfo-partial.state", dst / "ck.pt.dfo-partial"
    proc = start_relay(sandbox, f"kpro6:{src}/ck.pt", f"ct129:{dst}/ck.pt", "--bwlimit", "6M")
    wait_for(lambda: done_chunks(journal) >= 2, "two chunks journaled", timeout=60, proc=proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    with open(partial, "r+b") as fh:  # corrupt one byte inside chunk 1, which the journal calls done
        fh.seek(CHUNK + 4321)
        byte = fh.read(1)
        fh.seek(CHUNK + 4321)
        fh.write(bytes([byte[0] ^ 0xFF]))

    out = relay_json(sandbox, f"kpro6:{src}/ck.pt", f"ct129:{dst}/ck.pt", "--streams", "2")
    f = out["files"][0]
    assert f["bad_chunks"] == 1  # chunk 1: journaled as done, but its bytes no longer match the source
    assert out["resumed_bytes"] >= CHUNK and out["resumed_bytes"] % CHUNK == 0
    assert out["sent_bytes"] + out["resumed_bytes"] == size
    assert sha(dst / "ck.pt") == digest == out["sha256"]


def test_growing_source_is_refused_and_leaves_no_final_file(sandbox, paths):
    src, dst = paths
    random_file(src / "live.pt", 5 * CHUNK)
    journal = dst / "live.pt.dfo-partial.state"
    proc = start_relay(sandbox, f"kpro6:{src}/live.pt", f"ct129:{dst}/live.pt", "--bwlimit", "6M")
    wait_for(lambda: done_chunks(journal) >= 1, "a chunk journaled", timeout=60, proc=proc)
    with open(src / "live.pt", "ab") as fh:  # the trainer is still writing
        fh.write(os.urandom(MiB))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "changed during the relay" in err and "--wait-stable" in err and "Traceback" not in err
    assert not (dst / "live.pt").exists()


def test_wait_stable_waits_for_a_quiet_source(sandbox, paths):
    src, dst = paths
    target = src / "settling.pt"
    random_file(target, MiB)
    stop = time.monotonic() + 1.5

    def writer() -> None:
        while time.monotonic() < stop:
            with open(target, "ab") as fh:
                fh.write(b"x" * 1000)
            time.sleep(0.2)

    import threading
    t = threading.Thread(target=writer)
    t.start()
    try:
        out = relay_json(sandbox, f"kpro6:{target}", f"ct129:{dst}/settling.pt", "--wait-stable", "1")
    finally:
        t.join()
    assert sha(dst / "settling.pt") == sha(target) == out["sha256"]


def _ct129_mount_ns(box) -> int:
    # The host's sshd runs under `ip netns exec`, which gives it its own mount namespace: mount there.
    pid = box.hosts["ct129"].pid
    assert pid
    return pid


def test_too_little_space_fails_cleanly_before_and_during(sandbox, paths):
    src, dst = paths
    random_file(src / "big.pt", 3 * CHUNK)
    small = dst / "small fs"
    small.mkdir()
    pid = _ct129_mount_ns(sandbox)
    mount = subprocess.run(["nsenter", "-t", str(pid), "-m", "--", "mount", "-t", "tmpfs", "-o", "size=4M",
                            "dfo-relay-test", str(small)], capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for ct129 (needs root and nsenter): {mount.stderr.strip()}")

    def on_ct129(*argv: str) -> str:
        return subprocess.run(["nsenter", "-t", str(pid), "-m", "--", *argv], capture_output=True, text=True).stdout

    try:
        # The free-space check refuses before anything is written.
        proc = dfo(sandbox, "relay-checkpoint", f"kpro6:{src}/big.pt", f"ct129:{small}/big.pt")
        assert proc.returncode == 1
        said = " ".join(proc.stderr.split())  # the terminal width may wrap a line anywhere
        assert "not enough free space" in said and "12.0 MiB" in said and "4.0 MiB" in said
        assert on_ct129("ls", "-A", str(small)).split() == []

        # The check skipped (as if another writer filled the disk since): preallocation refuses.
        inv = load_inventory(sandbox.inventory_path)
        with Connector(inv) as conn, pytest.raises(HostError) as err:
            relay(conn, f"kpro6:{src}/big.pt", f"ct129:{small}/big.pt", RelayOptions(check_space=False))
        assert "no space to preallocate" in str(err.value) and "no final file was written" in str(err.value)
        assert on_ct129("ls", "-A", str(small)).split() == []

        # Mid-way (the up-front check and preallocation switched off, as on a filesystem without
        # fallocate that another writer fills): a clear error, and no final file.
        with Connector(inv) as conn, pytest.raises(HostError) as err:
            relay(conn, f"kpro6:{src}/big.pt", f"ct129:{small}/big.pt",
                  RelayOptions(check_space=False, preallocate=False))
        assert "no space left on device" in str(err.value) and "big.pt.dfo-partial" in str(err.value)
        assert "no final file was written" in str(err.value)
        assert "big.pt" not in on_ct129("ls", "-A", str(small)).split()
    finally:
        subprocess.run(["nsenter", "-t", str(pid), "-m", "--", "umount", str(small)], capture_output=True)


def test_link_down_mid_relay_fails_clearly_and_resumes_after_link_up(fresh_sandbox, tmp_path):
    box = fresh_sandbox
    if not box.isolated:
        pytest.skip(f"needs network namespaces: {box.reason}")
    src, dst = box.hosts["kpro6"].checkpoints, box.hosts["ct129"].checkpoints
    size = 6 * CHUNK
    digest = random_file(src / "net.pt", size)
    journal = dst / "net.pt.dfo-partial.state"
    proc = start_relay(box, f"kpro6:{src}/net.pt", f"ct129:{dst}/net.pt", "--bwlimit", "6M", "--stall-timeout", "3")
    wait_for(lambda: done_chunks(journal) >= 2, "two chunks journaled", timeout=60, proc=proc)
    box.link_down("ct129")
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        box.link_up("ct129")
    assert proc.returncode == 1
    err = " ".join(err.split())  # the terminal width may wrap a line anywhere
    assert "ct129: no data moved for" in err and "network down" in err and "re-run the same command" in err
    assert "Traceback" not in err
    assert not (dst / "net.pt").exists()

    out = relay_json(box, f"kpro6:{src}/net.pt", f"ct129:{dst}/net.pt")
    assert out["resumed_bytes"] >= 2 * CHUNK and out["sent_bytes"] + out["resumed_bytes"] == size
    assert sha(dst / "net.pt") == digest == out["sha256"]


# ----------------------------------------------------------------------------------- data plane and cipher


def test_paramiko_fallback_on_real_sshd(sandbox, paths):
    src, dst = paths
    digest = random_file(src / "pm.bin", 3 * CHUNK + 1)
    for streams in ("1", "2"):
        out = relay_json(sandbox, f"kpro6:{src}/pm.bin", f"ct129:{dst}/pm{streams}.bin", "--data-plane", "paramiko",
                         "--streams", streams)
        assert out["data_plane"] == "paramiko"
        assert sha(dst / f"pm{streams}.bin") == digest == out["sha256"]
    # A controller without an ssh binary falls back to paramiko by itself.
    env = {**dfo_env(sandbox.inventory_path), "PATH": str(Path(sys.executable).parent)}
    proc = subprocess.run(dfo_argv("relay-checkpoint", f"kpro6:{src}/pm.bin", f"ct129:{dst}/pm4.bin", "--json"),
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["data_plane"] == "paramiko" and sha(dst / "pm4.bin") == digest
    # The rekey fix: the server, not paramiko, drives rekeying on the relay's streams -- on its own sessions
    # only, never for every paramiko connection in the process.
    before = (paramiko.packet.Packetizer.REKEY_BYTES, paramiko.packet.Packetizer.REKEY_PACKETS)
    from orchestrator.transport.control import HostSession

    raised: list[tuple[str, int]] = []
    real = HostSession.raise_rekey_limits

    def spy(self):  # records which stream sessions got the fix, then applies it
        real(self)
        raised.append((self.name, self.transport.packetizer.REKEY_BYTES))

    inv = load_inventory(sandbox.inventory_path)
    HostSession.raise_rekey_limits = spy
    try:
        with Connector(inv) as conn:
            relay(conn, f"kpro6:{src}/pm.bin", f"ct129:{dst}/pm3.bin", RelayOptions(data_plane="paramiko"))
    finally:
        HostSession.raise_rekey_limits = real
    assert {h for h, _ in raised} == {"kpro6", "ct129"} and all(b >= 1 << 40 for _, b in raised)
    assert (paramiko.packet.Packetizer.REKEY_BYTES, paramiko.packet.Packetizer.REKEY_PACKETS) == before


def test_explicit_cipher_and_fallback_when_a_host_lacks_aes_gcm(fresh_sandbox):
    box = fresh_sandbox
    src, dst = box.hosts["kpro6"].checkpoints, box.hosts["ct129"].checkpoints
    digest = random_file(src / "c.bin", MiB)
    out = relay_json(box, f"kpro6:{src}/c.bin", f"ct129:{dst}/c1.bin", "--cipher", "aes256-ctr")
    assert out["cipher"] == "aes256-ctr" and sha(dst / "c1.bin") == digest

    bad = dfo(box, "relay-checkpoint", f"kpro6:{src}/c.bin", f"ct129:{dst}/c2.bin", "--cipher", "rot13")
    assert bad.returncode == 2 and "--cipher 'rot13'" in bad.stderr

    # ct129 stops offering aes128-gcm: the relay notices and uses ssh's default cipher.
    box.stop_host("ct129")
    with open(box.hosts["ct129"].sshd_config, "a") as fh:
        fh.write("Ciphers chacha20-poly1305@openssh.com,aes128-ctr\n")
    box.start_host("ct129")
    out = relay_json(box, f"kpro6:{src}/c.bin", f"ct129:{dst}/c3.bin")
    assert out["cipher"] is None and "ct129 does not offer aes128-gcm" in out["cipher_reason"]
    assert sha(dst / "c3.bin") == digest

    # The bulk streams verify host keys like the control plane, and say so as clearly.
    box.regenerate_host_key("ct129")
    bad = dfo(box, "relay-checkpoint", f"kpro6:{src}/c.bin", f"ct129:{dst}/c4.bin")
    assert bad.returncode == 1 and "HOST KEY MISMATCH" in bad.stderr and "Traceback" not in bad.stderr
    assert not list(dst.glob("c4.bin*"))


# ru_maxrss counts a child's pages from before its exec: a dfo forked straight from this (large, torch-
# importing) pytest would report pytest's size. A small launcher forks dfo and reports dfo's own peak.
_LAUNCHER = """
import json, os, subprocess, sys
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
out, err = p.stdout.read(), p.stderr.read()
_, status, usage = os.wait4(p.pid, 0)
print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "maxrss_kib": usage.ru_maxrss,
                  "out": out.decode(), "err": err.decode()}))
"""


def test_controller_memory_stays_flat(sandbox, paths):
    src, dst = paths
    size = 96 * MiB
    digest = random_file(src / "rss.bin", size)
    argv = dfo_argv("relay-checkpoint", f"kpro6:{src}/rss.bin", f"ct129:{dst}/rss.bin", "--json", "--streams", "2")
    proc = subprocess.run([sys.executable, "-c", _LAUNCHER, *argv], env=dfo_env(sandbox.inventory_path),
                          capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stdout)
    assert report["rc"] == 0, report["err"]
    assert json.loads(report["out"])["sha256"] == digest
    peak = report["maxrss_kib"] * 1024
    assert peak < 200 * MiB, f"dfo peak RSS {peak / MiB:.0f} MiB for a {size // MiB} MiB relay"


# ----------------------------------------------------------------------------------- --strip-optimizer


def _fake_training_checkpoint(path: Path) -> dict:
    torch = pytest.importorskip("torch")
    from remote_payload.fixtures.models import DRAFTER_SPEC
    from remote_payload.models.drafter import DFlashDrafter
    from remote_payload.models.spec import from_training

    spec = {**DRAFTER_SPEC, "mask_token_id": 5}
    torch.manual_seed(0)
    model = DFlashDrafter(from_training(spec, {}, "test spec"))
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if not k.startswith("rotary_emb.")}
    optimizer = {"state": {i: {"exp_avg": torch.randn_like(v), "exp_avg_sq": torch.rand_like(v)}
                           for i, v in enumerate(state.values())}, "param_groups": [{"lr": 1e-4}]}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": state, "optimizer": optimizer, "config": spec, "step": 1234}, path)
    return state


def _inventory_with_torch_on_kpro6(box, tmp_path: Path) -> Path:
    """The sandbox hosts' python has no torch; kpro6 shares this filesystem, so it may use ours."""
    from ruamel.yaml import YAML

    yaml = YAML()
    data = yaml.load(box.inventory_path.read_text())
    data["hosts"]["kpro6"]["python"] = sys.executable
    out = tmp_path / "inventory-torch.yaml"
    with open(out, "w") as fh:
        yaml.dump(data, fh)
    return out


def test_strip_optimizer_relays_loadable_drafter_weights(sandbox, paths, tmp_path):
    src, dst = paths
    ckpt = src / "step 1234.pt"
    state = _fake_training_checkpoint(ckpt)
    inventory = _inventory_with_torch_on_kpro6(sandbox, tmp_path)
    scratch = sandbox.hosts["kpro6"].workdir / "relay-strip"
    # what is there before (the worker's sandbox is shared: a watch test may have kept its stripped copy there)
    before = set(scratch.glob("*"))
    out = relay_json(sandbox, f"kpro6:{ckpt}", f"ct129:{dst}/", "--strip-optimizer", inventory=inventory)
    folder = dst / "step 1234-weights"
    assert out["destination"] == f"ct129:{folder}" and out["kind"] == "dir"
    assert out["stripped_from"]["sha256"] == sha(ckpt) and out["stripped_from"]["step"] == 1234
    assert "optimizer" in out["stripped_from"]["dropped"]
    assert out["sent_bytes"] < ckpt.stat().st_size / 2  # the optimizer state did not cross

    import torch
    from safetensors.torch import load_file

    weights = load_file(str(folder / "model.safetensors"))
    assert set(weights) == set(state)
    assert all(torch.equal(weights[k], state[k]) for k in state)
    assert json.loads((folder / "config.json").read_text())
    # And the eval's own loader takes the relayed folder as a stripped training checkpoint.
    from remote_payload.models.checkpoint import load_drafter

    loaded = load_drafter(folder)
    assert loaded.source["stripped_from"]["sha256"] == sha(ckpt)
    assert all(torch.equal(loaded.weights[k], state[k]) for k in loaded.weights)
    manifest = json.loads((dst / "step 1234-weights.dfo-manifest.json").read_text())
    assert manifest["stripped_from"]["sha256"] == sha(ckpt)
    # The strip's scratch folder on the training host is gone after a verified relay.
    assert set(scratch.glob("*")) <= before


def test_strip_optimizer_refuses_an_unknown_layout_listing_its_keys(sandbox, paths, tmp_path):
    torch = pytest.importorskip("torch")
    src, dst = paths
    ckpt = src / "weird.pt"
    torch.save({"weights": {"w": torch.zeros(2)}, "opt": {}}, ckpt)
    inventory = _inventory_with_torch_on_kpro6(sandbox, tmp_path)
    proc = dfo(sandbox, "relay-checkpoint", f"kpro6:{ckpt}", f"ct129:{dst}/", "--strip-optimizer", inventory=inventory)
    assert proc.returncode == 1
    assert "kpro6: strip-checkpoint" in proc.stderr and "weights" in proc.stderr and "opt" in proc.stderr
    assert list(dst.iterdir()) == []


def test_strip_optimizer_of_an_empty_pt_says_so_without_a_traceback(sandbox, paths, tmp_path):
    # (a text file and the other cases: tests/payload/models/test_drafter_formats.py, no host needed)
    src, dst = paths
    ckpt = src / "garbage.pt"
    ckpt.write_bytes(b"")
    said = "an empty file (0 bytes)"
    inventory = _inventory_with_torch_on_kpro6(sandbox, tmp_path)
    proc = dfo(sandbox, "relay-checkpoint", f"kpro6:{ckpt}", f"ct129:{dst}/", "--strip-optimizer", inventory=inventory)
    shown = " ".join(proc.stderr.split())
    assert proc.returncode == 1 and f"kpro6: strip-checkpoint of {ckpt} failed: training checkpoint" in shown, shown
    assert said in shown and "Traceback" not in proc.stderr and "IndexError" not in proc.stderr
    assert "Python objects" not in shown and list(dst.iterdir()) == []


def test_api_errors_are_dfo_errors(sandbox, paths):
    src, dst = paths
    random_file(src / "x.bin", 10)
    inv = load_inventory(sandbox.inventory_path)
    with Connector(inv) as conn:
        with pytest.raises(DfoError):
            relay(conn, f"kpro6:{src}/x.bin", f"ct129:{dst}/x.bin", RelayOptions(stall_timeout=0))
        with pytest.raises(DfoError):
            relay(conn, f"kpro6:{src}/x.bin", f"ct129:{dst}/x.bin", RelayOptions(data_plane="carrier-pigeon"))
        result = relay(conn, f"kpro6:{src}/x.bin", f"ct129:{dst}/x.bin")
    assert result.as_dict()["sha256"] == sha(src / "x.bin")
    assert isinstance(OperationError("x"), DfoError)


class RecordingEvents:
    """An Events whose relay progress records what the relay reported (no terminal involved)."""

    is_terminal = False

    def __init__(self):
        self.calls: list[tuple] = []

    def info(self, text):
        self.calls.append(("info", text))

    def relay_progress(self):
        events = self

        class Progress:
            def __getattr__(self, name):
                return lambda *args: events.calls.append((name, *args))

        return Progress()


def test_the_relay_reports_its_bytes_as_events(sandbox, paths):
    """The relay builds no bar: it reports to the Events it is given, and the bytes it reports add up."""
    src, dst = paths
    size = 3 * CHUNK + 12345
    random_file(src / "ev.bin", size)
    events = RecordingEvents()
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        relay(conn, f"kpro6:{src}/ev.bin", f"ct129:{dst}/ev.bin", RelayOptions(streams=2), events=events)
    names = [c[0] for c in events.calls]
    assert names[0] == "start" and names[-1] == "stop"
    start = events.calls[0]
    assert start[1] == "ev.bin" and start[2] == size and start[3] == 2
    advanced = [c for c in events.calls if c[0] == "advance"]
    assert sum(n for _, _stream, n in advanced) == size
    assert {stream for _, stream, _n in advanced} <= {0, 1}
    assert sha(dst / "ev.bin") == sha(src / "ev.bin")
