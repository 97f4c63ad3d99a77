"""The seeds of the differential fuzz tests (``tests/**/test_fuzz_*.py``).

``FUZZ_SEEDS=LOW:HIGH`` (or ``LOW-HIGH``) runs seeds LOW .. HIGH-1 in every one of them
instead of its default, e.g. ``FUZZ_SEEDS=0:500 python -m pytest tests -k fuzz``.
"""

from __future__ import annotations

import os
import re


def fuzz_seeds(default: str) -> list[int]:
    """Seeds ``default`` (``"LOW:HIGH"``), or ``$FUZZ_SEEDS`` where set."""
    text = os.environ.get("FUZZ_SEEDS", default)
    bounds = re.fullmatch(r"\s*(\d+)\s*[:-]\s*(\d+)\s*", text)
    if bounds is None:
        raise ValueError(f"FUZZ_SEEDS={text!r}: write LOW:HIGH, e.g. 0:500")
    return list(range(int(bounds[1]), int(bounds[2])))
