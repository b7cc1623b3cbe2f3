"""Reading a chart PNG back for tests: decoded with matplotlib's own reader, columns searched for a colour."""

from __future__ import annotations

import io
from typing import Any

from bot.charts.render import INTERRUPTION_COLOUR


def decoded(png: bytes) -> Any:
    """The image as an (height, width, channels) array of 0-255 integers."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import image

    pixels = image.imread(io.BytesIO(png), format="png")
    return (pixels[:, :, :3] * 255).round().astype(int)


def rgb(colour: str) -> tuple[int, int, int]:
    value = colour.lstrip("#")
    return int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16)


def colour_rows(pixels: Any, x: float, colour: str = INTERRUPTION_COLOUR, slack: int = 1) -> int:
    """How many rows have exactly ``colour`` within ``slack`` columns of pixel column ``x``."""
    red, green, blue = rgb(colour)
    column = int(x)
    band = pixels[:, max(column - slack, 0) : column + slack + 1, :]
    hits = (band[:, :, 0] == red) & (band[:, :, 1] == green) & (band[:, :, 2] == blue)
    return int(hits.any(axis=1).sum())


def _hits(pixels: Any, colour: str) -> Any:
    red, green, blue = rgb(colour)
    return (pixels[:, :, 0] == red) & (pixels[:, :, 1] == green) & (pixels[:, :, 2] == blue)


def lowest_row(pixels: Any, colour: str) -> int:
    """The lowest row with ``colour`` in it (-1: none): in a bar chart, just above the axis when a bar has it."""
    rows = _hits(pixels, colour).any(axis=1).nonzero()[0]
    return int(rows[-1]) if len(rows) else -1


def bars(pixels: Any, colour: str, row: int) -> int:
    """How many runs of ``colour`` cross ``row``: taken just above the axis (:func:`lowest_row` of a colour every
    bar is drawn in), the bars of that colour, not the legend's sample higher up."""
    hits = _hits(pixels, colour)[row]
    return int(hits[0]) + int((hits[1:] & ~hits[:-1]).sum())
