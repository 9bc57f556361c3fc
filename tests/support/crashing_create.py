"""Run one create in this process with a failpoint armed; the process is
expected to SIGKILL itself at that boundary. Used by recovery tests, and as
a creation's owner that a test SIGKILLs or SIGSTOPs itself
(tests/integration/test_lease_heartbeats.py).

usage: python -m tests.support.crashing_create SETTINGS_JSON SECRET BODY_JSON [REQUEST_ID]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kandev_es.bootstrap import bootstrap
from kandev_es.config import Settings
from kandev_es.observability import serving


def main() -> int:
    raw = json.loads(sys.argv[1])
    raw["data_dir"] = Path(raw["data_dir"])
    raw["repository_roots"] = tuple(Path(root) for root in raw.get("repository_roots", ()))
    settings = Settings(**raw)
    services = bootstrap(settings)
    principal = services.tokens.authenticate(sys.argv[2])
    request_id = sys.argv[4] if len(sys.argv) > 4 else ""
    with serving.acting_for(request_id or None):
        result = services.creation.create(principal, json.loads(sys.argv[3]))
    print(json.dumps(result.to_response()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
