"""What one kind measures once per session and offers another kind of the same spec: a key.

A measurement is slow and taken once (``gpu/measure.py``); a kind that stands on another's
measurement must neither take it again nor reach into that kind's module. So the kind that takes
it offers it on the target's ``Facts`` under a key (``Facts.offer``), and a kind that wants it
asks for it by the same key (``Facts.asked``), when its check runs: the offering kind may expand
after the asking one. A key names the spec file it belongs to, so a kind uses what its own spec
measures, and nothing where its spec measures nothing.

The keys of the built-in kinds:

- ``p2p_bandwidth(spec)``: every ordered GPU pair's P2P bandwidth as the spec's ``p2p`` section
  measures it (``gpu.bandwidth.Measurements``, keyed ``A->B``), offered where the section
  measures the pairs; a collective's ring is bounded by its hops' (``nccl_explain``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

import msgspec

if TYPE_CHECKING:
    from ..gpu.bandwidth import Measurements

T = TypeVar("T")


class Offer(msgspec.Struct, Generic[T], frozen=True):
    """A key of what one kind offers: its name and the spec file whose section takes it."""

    name: str
    spec: str


def p2p_bandwidth(spec: str) -> Offer[Measurements]:
    """The P2P bandwidth of every ordered GPU pair that the p2p section of ``spec`` measures."""
    return Offer("p2p bandwidth", spec)
