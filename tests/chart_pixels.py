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
