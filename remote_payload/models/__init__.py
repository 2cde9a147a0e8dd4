"""The models the eval runs: the target, the DFlash drafter, checkpoint formats and specs, kernel policy."""
