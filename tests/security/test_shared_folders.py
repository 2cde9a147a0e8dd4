"""Issue 30, finding 1: the GPU kit's site folder, and every scratch folder dfo makes in a shared place.

Another local user who creates the folder dfo is about to use (a fixed name in /tmp, or the name between a
``rm -rf`` and a ``mkdir -p``) gets their ``sitecustomize.py`` run by every step of the check. The helper
(remote_payload/scratch.py) makes a new folder with mkdtemp or takes a named one only if it is private.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from remote_payload.scratch import UnsafeFolder, check_private, own_dir, private_dir

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check.sh"


def _wheel(folder: Path) -> Path:
    """A one-module wheel, enough for the script's install step (pip --no-index --no-deps)."""
    folder.mkdir()
    whl = folder / "dfo_probe-0.1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("dfo_probe.py", "VALUE = 30\n")
        z.writestr("dfo_probe-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: dfo-probe\nVersion: 0.1\n")
        z.writestr("dfo_probe-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                    "Tag: py3-none-any\n")
        z.writestr("dfo_probe-0.1.dist-info/RECORD", "")
    return folder


def _planting_mkdir(shims: Path, marker: Path) -> None:
    """A ``mkdir`` first on PATH that lets 'another user' win the race for any dfo-gpu-site folder: it makes
    the folder world-writable with a sitecustomize.py before the real mkdir runs (``-p`` then accepts it)."""
    shims.mkdir()
    (shims / "mkdir").write_text(f"""#!/bin/bash
for a in "$@"; do
  case "$a" in *dfo-gpu-site*|*/site)
    /bin/mkdir -p "$a" && chmod 0777 "$a"
    echo 'open({json.dumps(str(marker))}, "w").write("planted code ran")' > "$a/sitecustomize.py" ;;
  esac
done
exec /bin/mkdir "$@"
""")
    (shims / "mkdir").chmod(0o755)


def _gpu_check(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DFO_GPU_SITE")}
    base.update(TMPDIR=str(tmp_path / "tmp"), **(env or {}))
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=base,
                          cwd=str(REPO))


def test_gpu_check_site_folder_is_private_and_never_a_planted_one(tmp_path):
    wheels, marker, shims = _wheel(tmp_path / "wheels"), tmp_path / "planted-ran", tmp_path / "shims"
    _planting_mkdir(shims, marker)
    path = f"{shims}:{os.environ['PATH']}"
    # --budget 30 leaves every step below its minimum: the run is the install, the site folder and the merges.
    common = ("--wheels", str(wheels), "--python", sys.executable, "--budget", "30")

    proc = _gpu_check(tmp_path, str(tmp_path / "out1"), *common, env={"PATH": path})
    log = (tmp_path / "out1" / "gpu-check.log").read_text()
    assert not re.search(r"/tmp/dfo-gpu-site(?![-\w])", log + proc.stdout + proc.stderr)  # no fixed name
    site = Path(log.split(" into ", 1)[1].split(":", 1)[0])
    assert site.parent == tmp_path / "tmp" and site.name.startswith("dfo-gpu-site-")
    assert not site.exists()  # the run's own folder went with the run
    assert list((tmp_path / "tmp").iterdir()) == []  # and the parts folder too
    assert not marker.exists()

    # A folder the user names is used only if private: one planted there (0777, another's code in it, even the
    # mark file older scripts trusted) is refused, never emptied and re-made with mkdir -p.
    named = tmp_path / "site"
    named.mkdir()
    named.chmod(0o777)
    (named / ".dfo-gpu-site").touch()
    (named / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('planted code ran')\n")
    proc = _gpu_check(tmp_path, str(tmp_path / "out2"), *common, env={"PATH": path, "DFO_GPU_SITE": str(named)})
    assert not marker.exists(), "another user's sitecustomize.py ran in the check"
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{named} has mode 0777; a private folder is 0700" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_the_printed_install_line_makes_its_own_private_folder(tmp_path):
    wheels = _wheel(tmp_path / "wheels")
    line = _gpu_check(tmp_path, "--print-install-line", "--wheels", str(wheels), "--python", sys.executable)
    assert line.returncode == 0 and not re.search(r"/tmp/dfo-gpu-site(?![-\w])", line.stdout)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TMPDIR": str(tmp_path / "tmp")}
    run = subprocess.run(["bash", "-c", line.stdout.strip() + ' && echo "$PYTHONPATH"'], capture_output=True, text=True,
                         cwd=str(REPO), env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    site = Path(run.stdout.strip())
    assert site.parent == tmp_path / "tmp" and (site / "dfo_probe.py").is_file()
    assert stat.S_IMODE(site.stat().st_mode) == 0o700 and site.stat().st_uid == os.getuid()


def test_the_helper_refuses_links_shared_modes_and_other_owners(tmp_path):
    made = private_dir("dfo-x-", tmp_path)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert own_dir(tmp_path / "mine") == tmp_path / "mine" and own_dir(tmp_path / "mine") == tmp_path / "mine"
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to(made)
    for bad, why in ((shared, "mode 0777"), (link, "not a folder"), (tmp_path / "nothing", "No such file")):
        with pytest.raises(UnsafeFolder, match=why):
            check_private(bad)
    if os.getuid() == 0:  # as root the suite can give a folder to another user; elsewhere ownership is the OS's
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(UnsafeFolder, match="belongs to uid 65534"):
            own_dir(theirs)
