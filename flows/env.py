"""Prefect settings for this project, applied before Prefect is imported (a user's own settings win).

Ephemeral mode keeps its SQLite database under artifacts/ (the checkout's, or ./artifacts where an installed
package runs), so a user's own Prefect home is untouched; the first start on a fresh home takes 20–27 s here, beyond
Prefect's 20 s default (STACK.md), hence the longer timeout. A user who configures PREFECT_API_URL gets their server
instead.
"""
import os
from pathlib import Path

from contramine.pipeline.config.base import ARTIFACTS

DEFAULTS = {
    "PREFECT_HOME": str(ARTIFACTS / ".prefect"),
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_LOGGING_LOG_PRINTS": "true",
    "TOKENIZERS_PARALLELISM": "false",
}
for key, value in DEFAULTS.items():
    os.environ.setdefault(key, value)
# Prefect creates only the last path component of its home: on a fresh clone artifacts/ does not exist yet, and
# its warning would break the one-line error contract of the CLI.
try:
    Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
except OSError:
    pass
