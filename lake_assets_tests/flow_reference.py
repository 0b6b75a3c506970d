"""The whole read of one journal composed from the fragment rules (`cover`, `read_piece`,
`Sequencer`) in one call: a reference the fragment tests check those rules against. The feed
reads journals in Spark tasks (`flow_tasks.read_journal_task`), cut at gaps and across hours."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lake_assets.feeds.flow_fragments import (
    CoverPiece,
    Doc,
    Fragment,
    FragmentError,
    Gap,
    Sequencer,
    cover,
    read_piece,
)


@dataclass
class JournalRead:
    committed: list[Doc]
    pending: list[Doc]
    bad: list[FragmentError]
    counts: dict[str, int]
    gaps: list[Gap] = field(default_factory=list)


def read_journal(fragments: list[Fragment], fetch: Callable[[str], bytes]) -> JournalRead:
    """Read one journal's fragments: cover them, read the cover in order and sequence its transactions.

    `fetch(uri)` returns a fragment's stored bytes; its own errors (missing object, network) are not
    fragment errors and propagate. A fragment that fails inflate, verify, line splitting or document
    parsing is set aside whole (listed in `bad`) and the journal is covered again without it, until
    every piece of the cover reads; bytes no good fragment holds are `gaps`."""
    failed: dict[str, FragmentError] = {}
    read: dict[CoverPiece, list[Doc]] = {}
    while True:
        pieces, gaps = cover(fragments, failed)
        for piece in pieces:
            if piece not in read and piece.fragment.uri not in failed:
                try:
                    read[piece] = read_piece(piece, fetch)
                except FragmentError as e:
                    failed[piece.fragment.uri] = e
        if all(piece in read for piece in pieces):
            break
    sequencer = Sequencer()
    committed: list[Doc] = []
    for piece in pieces:
        for doc in read[piece]:
            committed.extend(sequencer.feed(doc))
    pending = sequencer.finish()
    counts = {
        "pieces": len(pieces),
        "bad_fragments": len(failed),
        "bytes": sum(piece.end - piece.start for piece in pieces),
        **sequencer.counts,
    }
    return JournalRead(
        committed=committed, pending=pending, bad=list(failed.values()), counts=counts, gaps=gaps
    )
