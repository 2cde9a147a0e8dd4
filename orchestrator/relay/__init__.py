"""`dfo relay-checkpoint`: verified, resumable relays between hosts that cannot reach each other."""
