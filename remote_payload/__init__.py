"""dfo remote payload: reference completions, hidden-state extraction and DFlash drafter evaluation.

Runs on the eval host as ``python -m remote_payload <subcommand>``. Keep this module (and every module
imported by ``--help`` / ``info``) free of heavy imports: torch and transformers are imported lazily.
"""

__version__ = "0.1.0"
RESULTS_SCHEMA = "dfo.results/2"  # /2: conventions named by whose rule they are (metrics/migrate.py)
