"""A real, one-node Slurm for the tests: munged, slurmctld and slurmd in the foreground, under one folder.

No systemd and no /etc: every path (munge socket and key, state, spool, logs) lives under ROOT and the
daemons listen on loopback ports chosen at start. Partition ``debug`` is up (the default); partition
``down`` is down, for the pending tests. The scheduler runs every second so tests stay short. With GPUS,
node1 has that many GPUs (generic resources Slurm schedules and hands to tasks as SLURM_GPUS_ON_NODE; no
device behind them).

With NETNS and ADDRESS (a sandbox host's network namespace, and this machine's address on that host's link)
the login node is that sandbox host: the daemons stay on this machine (slurmd needs the cgroup filesystem that
`ip netns exec` hides), the controller is reached at ADDRESS, and the commands of LocalLoginSession, like
those run over SSH on that host (its sshd lives in the namespace), run in the namespace. The filesystem is
this machine's, shared as a cluster's is.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.testing.slurm_accounting import AccountingDatabase, accounting_missing_reason
from orchestrator.transport.control import CommandResult

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")


def missing_reason() -> str | None:
    """Why a sandbox Slurm cannot start here (None when it can)."""
    if os.geteuid() != 0:
        return "the sandbox Slurm runs its daemons as root"
    absent = [name for name in DAEMONS if not shutil.which(name) and not Path("/usr/sbin", name).exists()]
    if absent:
        return f"Slurm is not installed (missing {', '.join(absent)}; scripts/setup.sh installs slurm-wlm and munge)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# A hidden partition with a CPU of its own (node1 has 3 configured, `debug` may use 2 of them, as before): the
# tests submit the job that waits out Slurm's one-minute time limit there when the session's Slurm starts, so that
# the minute passes while the other tests run, on no CPU of theirs (tests/fixtures_slurm.py).
LIMITS_PARTITION = "limits"


def _conf(root: Path, address: str, ctld_port: int, slurmd_port: int, min_job_age: int = 600, gpus: int = 0) -> str:
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    gres_types = "GresTypes=gpu\n" if gpus else ""
    limits = LIMITS_PARTITION
    return f"""ClusterName=dfosandbox
{gres_types}SlurmctldHost=localhost
SlurmctldAddr={address}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/run/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/log/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
InactiveLimit=0
MinJobAge={min_job_age}
KillWait=1
OverTimeLimit=0
MessageTimeout=5
SlurmdParameters=config_overrides
NodeName=node1 NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=3 RealMemory=1000{gres} State=UNKNOWN
PartitionName=debug Nodes=node1 Default=YES MaxTime=60 MaxCPUsPerNode=2 State=UP
PartitionName=down Nodes=node1 MaxTime=60 MaxCPUsPerNode=2 State=DOWN
PartitionName={limits} Nodes=node1 MaxTime=60 MaxCPUsPerNode=1 Hidden=YES State=UP
"""


@dataclass
class SandboxSlurm:
    root: Path
    netns: str | None = None
    address: str = "127.0.0.1"
    min_job_age: int = 600  # seconds slurmctld remembers a finished job (then only sacct knows it)
    gpus: int = 0  # count-only GPUs of node1 (Slurm GRES without device files: scheduling, no hardware)
    accounting: bool = False  # a real accounting database (MariaDB + slurmdbd, slurm_accounting.py) for sacct
    processes: list[subprocess.Popen] = field(default_factory=list)

    def _client(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else argv

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 30.0) -> "SandboxSlurm":
        for sub in ("run", "state", "spool", "log", "shared"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)  # munged checks its socket's folders are reachable
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        conf = _conf(self.root, self.address, _free_port(), _free_port(), self.min_job_age, self.gpus)
        database = None
        if self.accounting:
            database = AccountingDatabase(self.root / "accounting", self.root, self.root / "run" / "munge.socket",
                                          _free_port(), _free_port())
            conf = conf.replace("AccountingStorageType=accounting_storage/none\n",
                                database.slurm_conf_lines(self.address))
            database.install()
        self.conf.write_text(conf)
        if self.gpus:
            # Slurm 22.05 drops a GPU without a File (count-only), so each GPU is an empty file under ROOT (slurmd
            # logs that it is no device and keeps it; no cgroup confines devices here). gres.conf: beside slurm.conf.
            (self.root / "dev").mkdir(exist_ok=True)
            for index in range(self.gpus):
                (self.root / "dev" / f"gpu{index}").touch()
            (self.root / "gres.conf").write_text(
                f"AutoDetect=off\nName=gpu File={self.root}/dev/gpu[0-{self.gpus - 1}]\n")
        log = open(self.root / "log" / "daemons.out", "ab")
        run = self.root / "run"
        self.processes.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={run}/munge.socket", f"--key-file={key}",
             f"--pid-file={run}/munged.pid", f"--seed-file={run}/munge.seed", f"--log-file={self.root}/log/munged.log"],
            stdout=log, stderr=log))
        self._wait(lambda: (run / "munge.socket").exists(), timeout, "munged")
        if database is not None:
            self.processes.append(subprocess.Popen(database.mariadbd(), stdout=log, stderr=log))
            self._wait(database.mariadb_ready, timeout, "mariadbd")
            self.processes.append(subprocess.Popen(["slurmdbd", "-D"], stdout=log, stderr=log, env=self.env))
            self._wait(lambda: database.register_cluster(self.env), timeout, "slurmdbd (cluster registered)")
        self.processes.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(self.conf)], stdout=log,
                                               stderr=log, env=self.env))
        self.processes.append(subprocess.Popen(["slurmd", "-D", "-f", str(self.conf), "-N", "node1"], stdout=log,
                                               stderr=log, env=self.env))
        self._wait(lambda: "idle" in self.shell("sinfo -h -p debug -o %t").text, timeout, "slurmd (node idle)")
        return self

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                self.stop()
                tail = (self.root / "log" / "daemons.out").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"sandbox Slurm: {what} did not come up:\n{tail}")
            time.sleep(0.2)

    def shell(self, line: str, stdin: bytes | None = None) -> CommandResult:
        done = subprocess.run(self._client(["bash", "-c", line]), input=stdin, capture_output=True, env=self.env,
                              timeout=60)
        return CommandResult("cluster", line, done.returncode, done.stdout, done.stderr)

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        self.processes.clear()


class LocalLoginSession:
    """The sandbox cluster's login node is this machine: commands run in bash with the sandbox's SLURM_CONF.
    Same ``run`` and ``python`` shapes as a control session, so the cluster operations run unchanged."""

    name = "cluster"
    interpreter = "python3"

    def __init__(self, slurm: SandboxSlurm):
        self.slurm = slurm
        self.session = self  # cluster.operation's LoginSession shape: hostcall runs through .session
        self.env: dict[str, str] = {}  # SLURM_CONF is in every command's environment already

    def python(self, script: str, *args: str, python: str = "python3", **kwargs) -> CommandResult:
        """SCRIPT run by PYTHON on the login node, sent on stdin (as a control session's ``python``)."""
        return self.run([python, "-", *args], stdin=script.encode(), **kwargs)

    def run(self, command, *, stdin: bytes | None = None, check: bool = True, timeout: float | None = None,
            env: dict[str, str] | None = None) -> CommandResult:
        import shlex

        from orchestrator.core.errors import HostError

        line = command if isinstance(command, str) else shlex.join(command)
        result = self.slurm.shell(line, stdin)
        if check and not result.ok:
            raise HostError(self.name, f"`{line[:80]}` exited with {result.exit_code}: {result.err_text[-300:]}")
        return result


def start_in_sandbox(box, root: Path, *, gpus: int = 0, accounting: bool = False,
                     min_job_age: int = 600) -> SandboxSlurm:
    """A sandbox Slurm whose login node is BOX's ct129 (its daemons under ROOT; node1 with GPUS count-only
    GPUs; with ACCOUNTING, an accounting database behind sacct); raises with the reason it cannot run here."""
    reason = missing_reason() or (accounting_missing_reason() if accounting else None)
    if reason:
        raise RuntimeError(reason)
    ct129 = box.host("ct129")
    return SandboxSlurm(root, netns=ct129.netns, address=ct129.gateway or "127.0.0.1", gpus=gpus,
                        accounting=accounting, min_job_age=min_job_age).start()


def cluster_inventory(box, slurm: SandboxSlurm, dest: Path, *, name: str = "hpc",
                      variants: dict[str, str] | None = None, time_limit: str = "10") -> Path:
    """BOX's inventory plus cluster host NAME: ct129's SSH, workdir (its release and venv) and paths, the
    sandbox's SLURM_CONF in its env, and a slurm: section whose shared folder is ct129's root (partition debug,
    TIME_LIMIT-minute tasks); plus one more host per VARIANTS entry (host name -> more slurm: keys, as YAML lines),
    by default NAME-serial, the same cluster one task at a time. Written to DEST."""
    from orchestrator.core.inventory import load_inventory

    text = Path(box.inventory_path).read_text()
    ct129 = load_inventory(box.inventory_path).host("ct129")
    host = (f"  {name}:\n    address: {ct129.address}\n    port: {ct129.port}\n    user: {ct129.user}\n"
            f"    identity_file: {ct129.identity_file}\n    known_hosts: {ct129.known_hosts}\n"
            f"    workdir: {ct129.workdir}\n    python: {ct129.python}\n    gpu: false\n"
            f"    paths:\n      checkpoints: {ct129.paths.checkpoints}\n      models: {ct129.paths.models}\n"
            f"    env:\n      SLURM_CONF: {slurm.conf}\n"
            f"    slurm:\n      shared: {box.hosts['ct129'].root_dir}\n      partition: debug\n"
            f"      time_limit: '{time_limit}'\n")
    if variants is None:
        variants = {f"{name}-serial": "max_parallel: 1"}
    more = "".join(host.replace(f"  {name}:\n", f"  {variant}:\n", 1)
                   + "".join(f"      {line}\n" for line in keys.splitlines()) for variant, keys in variants.items())
    dest.write_text(text + host + more)
    return dest
