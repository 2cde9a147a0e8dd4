"""Run checks, `--diagnose` probes and reports, and the GPU kernel check (`gpu-check`)."""
