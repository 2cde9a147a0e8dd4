"""What every feature builds on: errors, the inventory (loading, ssh_config, byte-preserving edits), hashing."""
