"""The watch tests share the eval tests' session fixture ``eval_hosts`` (both sandbox hosts deployed and
provisioned, the fixture target/drafters on ct129 and the trained checkpoint on kpro6), so the suite
builds them once."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evaluation"))
from test_eval_e2e import eval_hosts  # noqa: E402,F401
