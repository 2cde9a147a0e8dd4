"""`dfo deploy`: the payload as verified, content-addressed releases (manifest, operation, host script)."""
