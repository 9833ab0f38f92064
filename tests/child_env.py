"""The PYTHONPATH of the Python processes the tests start: the checkout, then subprocess_site/, whose sitecustomize
runs their flows without Prefect's heartbeat thread, as conftest.no_flow_heartbeats does in the test processes."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "tests" / "subprocess_site"
CHILD_PYTHONPATH = os.pathsep.join([str(ROOT), str(SITE)])
