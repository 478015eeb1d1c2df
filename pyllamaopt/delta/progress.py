"""Progress bars of the delta tool (tqdm on stderr; by default only on a terminal)."""
from __future__ import annotations

import sys

from tqdm import tqdm


def progress_bar(total: int, desc: str, unit: str, enabled: bool | None) -> tqdm:
    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr,
                disable=(not sys.stderr.isatty()) if enabled is None else not enabled,
                unit_scale=unit == "B")
