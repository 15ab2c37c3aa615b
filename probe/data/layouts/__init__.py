"""Row layouts: how the position axis of a captured value becomes stored rows.

Every batch has a layout. A value follows it when the axis that its capture kind runs along
positions is the layout's positions (``Axes``); for such a value the layout says which
positions count, how ``tokens=`` pools them, what one stored row is and how its axes are
named, and which bookkeeping rows go with them. The per-key transform, the hooks, the dry run
and the runner ask the layout and never look inside it, so a new kind of rows is one more
class here.

    base.py        RowLayout, Axes, SAMPLE_ROWS (one row per sample: what follows no layout)
    positions.py   Positions (ragged, a mask of real ones), Pieces (a sample fed in windows),
                   Answered (prompts, then the answers generated for them)
    grid.py        PatchGrid (class and register tokens, then patches on a grid)
    parts.py       ImageText (a vision-language model: the language model's positions, and
                   the vision tower's and projector's own layouts)
    decoded.py     Decoded (an encoder-decoder: the text's positions for its encoder, the
                   target's for its decoder, each bounded by their own offsets)
"""

from probe.data.layouts.base import (
    POSITIONS_FIRST,
    SAMPLE_ROWS,
    Axes,
    RowLayout,
    SampleRows,
    Stored,
    feature_dims,
    plain_dims,
)
from probe.data.layouts.decoded import Decoded
from probe.data.layouts.grid import PatchGrid
from probe.data.layouts.parts import ImageText
from probe.data.layouts.positions import Answered, Pieces, Positions

__all__ = ["RowLayout", "Axes", "POSITIONS_FIRST", "Stored", "SampleRows", "SAMPLE_ROWS",
           "Positions", "Pieces", "Answered", "PatchGrid", "ImageText", "Decoded", "plain_dims",
           "feature_dims"]
