"""Which prompt version a request gets in an experiment (pure): a sticky, salted hash split.

The unit (a conversation, else an API key, else the single query) is hashed with SHA-256 together
with the experiment id into a number in [0, 1); the unit is in the candidate arm when that number
is below the candidate's share. So:

- sticky: the same experiment and unit always get the same variant, with no stored assignment;
- salted: each experiment hashes its own id in, so two experiments split the same units
  independently (a unit's arm in one says nothing about its arm in another);
- monotone in the share: raising the share only moves control units to the candidate, never
  back, so ramping an experiment up keeps every earlier candidate unit where it was.
"""

from __future__ import annotations

import hashlib

from rag_service.domain.prompts import Variant


def bucket(experiment_id: str, unit: str) -> float:
    """A deterministic number in [0, 1), uniform over units, from SHA-256 of ``experiment_id:unit``."""
    digest = hashlib.sha256(f"{experiment_id}:{unit}".encode()).digest()
    # The first 8 bytes as an integer; only its top 53 bits are kept, because a float holds 53 and
    # (2**64 - 1) / 2**64 would round up to 1.0, outside [0, 1).
    return (int.from_bytes(digest[:8], "big") >> 11) / 2**53


def assign(experiment_id: str, unit: str, share: float) -> Variant:
    """The unit's variant when the candidate gets ``share`` of units (0 = nobody, 1 = everybody)."""
    if not 0.0 <= share <= 1.0:  # also refuses NaN
        raise ValueError(f"share is the candidate's fraction of units and must be in [0, 1], got {share}")
    return "candidate" if bucket(experiment_id, unit) < share else "control"
