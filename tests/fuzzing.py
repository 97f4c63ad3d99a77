"""The seeds of the differential fuzz tests (``tests/**/test_fuzz_*.py``).

``FUZZ_SEEDS=LOW:HIGH`` (or ``LOW-HIGH``) runs seeds LOW .. HIGH-1 in every one of them
instead of its default, e.g. ``FUZZ_SEEDS=0:500 python -m pytest tests -k fuzz``.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path


def fuzz_seeds(default: str) -> list[int]:
    """Seeds ``default`` (``"LOW:HIGH"``), or ``$FUZZ_SEEDS`` where set."""
    text = os.environ.get("FUZZ_SEEDS", default)
    bounds = re.fullmatch(r"\s*(\d+)\s*[:-]\s*(\d+)\s*", text)
    if bounds is None:
        raise ValueError(f"FUZZ_SEEDS={text!r}: write LOW:HIGH, e.g. 0:500")
    return list(range(int(bounds[1]), int(bounds[2])))


def run_seeds(case: Callable[[int, Path], object], low: int, high: int) -> list[int]:
    """The fuzz files' command-line form (``python tests/unit/data/test_fuzz_x.py LOW HIGH``):
    ``case(seed, folder)`` for seeds LOW .. HIGH-1, each in a temporary folder of its own;
    prints each failure (its traceback too with ``TB=1``), then the failing seeds and how often
    each outcome the case returned came up. Returns the failing seeds."""
    failures, outcomes = [], Counter()
    for seed in range(low, high):
        root = Path(tempfile.mkdtemp())
        try:
            outcomes[case(seed, root)] += 1
        except Exception as err:  # noqa: BLE001  (every failure is reported, none stops the run)
            failures.append(seed)
            print(f"--- seed {seed}: {type(err).__name__}: {str(err)[:800]}")
            if os.environ.get("TB"):
                traceback.print_exc()
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{len(failures)} failures of {high - low}: {failures}; outcomes {dict(outcomes)}")
    return failures
