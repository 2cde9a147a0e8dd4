"""`dfo provision`: the payload's uv venv on a host, from hash-pinned locks (wheelhouses for offline hosts)."""
