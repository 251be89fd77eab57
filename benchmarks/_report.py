"""What the benchmarks share: printing a result dict (not a benchmark; ``make bench`` skips ``_*.py``)."""

from __future__ import annotations

import json
from typing import Any


def print_result(res: dict[str, Any], as_json: bool, width: int) -> None:
    """``res`` as indented JSON (``--json``), else one ``key value`` line per entry, keys padded to ``width``."""
    if as_json:
        print(json.dumps(res, indent=2))
    else:
        for key, value in res.items():
            print(f"{key:{width}s} {value}")
