"""Replacing folders and files atomically: the wheelhouse cache, and inventory edits through a symlink."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from orchestrator.core.inventory_edit import write_inventory
from orchestrator.provision.wheelhouse import publish_dir


def _folder(root: Path, name: str, files: int, tag: str) -> Path:
    d = root / name
    d.mkdir()
    for i in range(files):
        (d / f"w{i}.whl").write_text(tag)
    return d


def test_a_wheelhouse_is_switched_whole(tmp_path):
    final = tmp_path / "wheelhouse" / "key"
    final.parent.mkdir()
    _folder(final.parent, "key", 200, "old")  # a plain folder, as older dfo versions left it
    seen, stop = set(), threading.Event()

    def reader():
        while not stop.is_set():
            try:
                seen.add(len(os.listdir(final)))
            except (FileNotFoundError, NotADirectoryError):
                seen.add("missing")

    t = threading.Thread(target=reader)
    t.start()
    try:
        for round_ in range(20):
            publish_dir(_folder(tmp_path, f"new{round_}", 200, f"v{round_ % 2}"), final)
    finally:
        stop.set()
        t.join()
    # The name always showed a whole wheelhouse: never missing, never half deleted.
    assert seen == {200}, seen
    assert final.is_symlink() and {p.read_text() for p in final.iterdir()} == {"v1"}
    # Replaced folders go on a later publish, once old enough that no reader can still be in them.
    for old in final.parent.glob(".key.v-*"):
        os.utime(old, (0, 0))
    publish_dir(_folder(tmp_path, "last", 3, "v9"), final)
    assert [p.name for p in final.parent.iterdir() if p.name.startswith(".key.v-")] == [os.readlink(final)]


INVENTORY = "hosts:\n  h: {address: h, workdir: /w}\n"


def test_an_inventory_edit_keeps_a_symlinked_inventory_a_symlink(tmp_path):
    real_dir = tmp_path / "dotfiles"
    real_dir.mkdir()
    target = real_dir / "inventory.yaml"
    target.write_text(INVENTORY)
    link = tmp_path / "inventory.yaml"
    link.symlink_to(target)
    write_inventory(link, INVENTORY.replace("/w", "/work"))
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert "/work" in target.read_text()
    assert not [p for p in tmp_path.iterdir() if p.name not in ("dotfiles", "inventory.yaml")]
    assert sorted(p.name for p in real_dir.iterdir()) == ["inventory.yaml"]


def test_run_folder_files_never_go_through_a_link_at_a_guessable_temporary_name(tmp_path):
    """Issue 42 (not counted): report.md, samples.jsonl, the profiles, the plots and series.md were written
    through fixed temporary names (.report.md.tmp …): a link planted there made dfo overwrite its target."""
    from orchestrator.core.atomic_file import atomic_target, write_text_atomic
    from orchestrator.evaluation.profile import write_profiles

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    (run / "profiles").mkdir(parents=True)
    for name in (".report.md.tmp", ".samples.jsonl.tmp", ".series.md.tmp", ".tau_vs_step.png.tmp",
                 "profiles/.d.tmp"):
        (run / name).symlink_to(victim)
    results = {"drafters": {"d": {"metrics": {"block_size": 4}}}}
    samples = [{"id": "a", "drafters": {"d": {"accepted": [3, 0, 1]}}}]
    (profile,) = write_profiles(run, results, samples)
    write_text_atomic(run / "report.md", "# report\n")
    with atomic_target(run / "tau_vs_step.png") as tmp:
        tmp.write_bytes(b"png")
    assert victim.read_text() == "precious\n"
    assert json.loads(profile.read_text())["block_size"] == 4 and (run / "report.md").read_text() == "# report\n"
    assert not profile.is_symlink() and (run / "tau_vs_step.png").read_bytes() == b"png"
    # Nothing is left behind under a temporary name, also when the writer fails.
    try:
        with atomic_target(run / "series.md"):
            raise RuntimeError("writer failed")
    except RuntimeError:
        pass
    assert not (run / "series.md").exists()
    assert sorted(p.name for p in run.glob(".*.tmp")) == [".report.md.tmp", ".samples.jsonl.tmp", ".series.md.tmp",
                                                            ".tau_vs_step.png.tmp"]  # only the planted links
