"""The accounting database of a sandbox Slurm (opt-in: ``SandboxSlurm(accounting=True)``): MariaDB and
slurmdbd in the foreground as root, under ROOT/accounting, so that ``sacct`` answers from a real database as on
a production cluster.

MariaDB gets a fresh data folder (``mariadb-install-db``), its own socket and a loopback TCP port, and one user
for slurmdbd with a random password (created by ``--init-file`` at start); slurmdbd's configuration, which holds
that password, is ``slurmdbd.conf`` beside slurm.conf (where slurmdbd looks for it), mode 0600. slurmdbd
listens on every address of this machine, so ``sacct`` reaches it from the login node's network namespace at
ADDRESS, as slurmctld does. The cluster is registered with ``sacctmgr`` before slurmctld starts.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

DB_TOOLS = ("mariadbd", "mariadb-install-db", "mariadb-admin", "slurmdbd", "sacctmgr")
CLUSTER = "dfosandbox"


def accounting_missing_reason() -> str | None:
    """Why the accounting database cannot start here (None when it can)."""
    absent = [name for name in DB_TOOLS if not shutil.which(name) and not Path("/usr/sbin", name).exists()]
    if absent:
        return (f"the sandbox Slurm's accounting database is not installed (missing {', '.join(absent)}; "
                "scripts/setup.sh installs mariadb-server and slurmdbd)")
    return None


@dataclass
class AccountingDatabase:
    root: Path        # ROOT/accounting: the database's files, socket and logs
    conf_dir: Path    # where slurm.conf lives (slurmdbd.conf goes beside it)
    munge_socket: Path
    db_port: int
    dbd_port: int

    def slurm_conf_lines(self, address: str) -> str:
        """slurm.conf's accounting lines: slurmctld and sacct reach slurmdbd at ADDRESS (with slurmdbd,
        AccountingStoragePass names the munge socket their requests are signed with)."""
        return (f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost={address}\n"
                f"AccountingStoragePort={self.dbd_port}\nAccountingStoragePass={self.munge_socket}\n")

    def install(self) -> None:
        """A fresh MariaDB data folder and slurmdbd.conf (the password drawn here, in no command line)."""
        (self.root / "run").mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={self.root}/data", "--user=root",
                               "--auth-root-authentication-method=socket", "--skip-test-db",
                               "--innodb-log-file-size=8M"], capture_output=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError("sandbox Slurm: mariadb-install-db failed:\n"
                               + done.stderr.decode(errors="replace")[-2000:])
        password = secrets.token_hex(16)
        init = self.root / "init.sql"
        init.write_text(f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';\n"
                        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';\n")
        init.chmod(0o600)
        conf = self.conf_dir / "slurmdbd.conf"
        conf.touch(mode=0o600)
        conf.chmod(0o600)  # slurmdbd refuses a configuration others can read
        conf.write_text(f"""AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
DbdHost=localhost
DbdPort={self.dbd_port}
SlurmUser=root
LogFile={self.root}/slurmdbd.log
PidFile={self.root}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.db_port}
StorageUser=slurm
StoragePass={password}
StorageLoc=slurm_acct_db
""")

    def mariadbd(self) -> list[str]:
        return ["mariadbd", "--no-defaults", f"--datadir={self.root}/data", "--user=root",
                f"--socket={self.root}/run/mariadb.sock", f"--port={self.db_port}", "--bind-address=127.0.0.1",
                "--skip-name-resolve", "--skip-log-bin", "--innodb-buffer-pool-size=32M",
                f"--pid-file={self.root}/run/mariadb.pid", f"--log-error={self.root}/mariadb.err",
                f"--init-file={self.root}/init.sql"]

    def mariadb_ready(self) -> bool:
        return subprocess.run(["mariadb-admin", "--no-defaults", f"--socket={self.root}/run/mariadb.sock", "ping"],
                              capture_output=True, timeout=30).returncode == 0

    def register_cluster(self, env: dict[str, str]) -> bool:
        """Add the sandbox cluster to the database (true once slurmdbd answered and the cluster is there)."""
        subprocess.run(["sacctmgr", "-i", "add", "cluster", CLUSTER], capture_output=True, env=env, timeout=30)
        listed = subprocess.run(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"], capture_output=True,
                                env=env, timeout=30)
        return listed.returncode == 0 and CLUSTER in listed.stdout.decode(errors="replace").split()
