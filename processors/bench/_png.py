"""A tiny PNG line-chart writer (zlib + struct only), so the harness can draw without matplotlib."""

from __future__ import annotations

import itertools
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Panel", "encode_png", "line_chart"]

RGB = tuple[int, int, int]

# 3x5 glyphs for tick labels: rows top to bottom, 3 bits each (4 = left pixel).
_FONT: dict[str, tuple[int, ...]] = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1),
    "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7), ".": (0, 0, 0, 0, 2), "k": (4, 5, 6, 5, 5),
    "M": (5, 7, 7, 5, 5), "m": (0, 0, 7, 7, 5), "s": (0, 3, 6, 1, 6), "/": (1, 1, 2, 4, 4),
    " ": (0, 0, 0, 0, 0), "x": (0, 5, 2, 5, 5), "e": (0, 7, 7, 4, 7), "v": (0, 5, 5, 5, 2),
}


def encode_png(width: int, height: int, rows: Sequence[bytes]) -> bytes:
    """An 8-bit RGB PNG from ``height`` rows of ``3 * width`` bytes."""
    if len(rows) != height or any(len(r) != 3 * width for r in rows):
        raise ValueError("rows do not match the image size")

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + r for r in rows)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) \
        + chunk(b"IEND", b"")


@dataclass(frozen=True)
class Panel:
    """One chart: y against x on a log x axis; ``series`` maps a label to (x, y) points."""

    title: str
    series: dict[str, list[tuple[float, float]]]
    unit: str = ""


_COLORS: tuple[RGB, ...] = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189))


class _Canvas:
    def __init__(self, w: int, h: int) -> None:
        self.w, self.h = w, h
        self.px = [bytearray(b"\xff" * (3 * w)) for _ in range(h)]

    def dot(self, x: int, y: int, c: RGB) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            self.px[y][3 * x:3 * x + 3] = bytes(c)

    def line(self, x0: int, y0: int, x1: int, y1: int, c: RGB, thick: int = 1) -> None:
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(n + 1):
            x, y = x0 + (x1 - x0) * i // n, y0 + (y1 - y0) * i // n
            for d in range(thick):
                self.dot(x, y + d, c)
                self.dot(x + d, y, c)

    def text(self, x: int, y: int, s: str, c: RGB = (0, 0, 0), scale: int = 2) -> None:
        for ch in s:
            for r, bits in enumerate(_FONT.get(ch, _FONT[" "])):
                for b in range(3):
                    if bits & (4 >> b):
                        for dy in range(scale):
                            for dx in range(scale):
                                self.dot(x + b * scale + dx, y + r * scale + dy, c)
            x += 4 * scale


def _short(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:.3g}M"
    if v >= 1e3:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def line_chart(panels: Sequence[Panel], *, width: int = 420, height: int = 300) -> bytes:
    """Panels side by side as one PNG: log-scale x, linear y from 0, tick labels in digits."""
    canvas = _Canvas(width * len(panels), height)
    for i, p in enumerate(panels):
        ox = i * width
        left, right, top, bottom = ox + 60, ox + width - 30, 20, height - 40
        canvas.line(left, top, left, bottom, (0, 0, 0))
        canvas.line(left, bottom, right, bottom, (0, 0, 0))
        pts = [pt for s in p.series.values() for pt in s if pt[0] > 0 and math.isfinite(pt[1])]
        if not pts:
            continue
        xs = sorted({x for x, _ in pts})
        lx0, lx1 = math.log10(xs[0]), math.log10(xs[-1])
        ymax = max(y for _, y in pts) * 1.1 or 1.0

        def sx(x: float, lx0: float = lx0, lx1: float = lx1, left: int = left, right: int = right) -> int:
            return left + int((math.log10(x) - lx0) / ((lx1 - lx0) or 1.0) * (right - left))

        def sy(y: float, ymax: float = ymax, top: int = top, bottom: int = bottom) -> int:
            return bottom - int(y / ymax * (bottom - top))

        for x in xs:
            canvas.line(sx(x), bottom, sx(x), bottom + 4, (0, 0, 0))
            canvas.text(sx(x) - 8, bottom + 8, _short(x))
        for k in range(5):
            y = ymax * k / 4
            canvas.line(left - 4, sy(y), left, sy(y), (0, 0, 0))
            canvas.text(ox + 4, sy(y) - 5, _short(y))
        canvas.text(left + 6, 4, p.unit)
        for n, (_, series) in enumerate(sorted(p.series.items())):
            color = _COLORS[n % len(_COLORS)]
            good = sorted(pt for pt in series if pt[0] > 0 and math.isfinite(pt[1]))
            for (x0, y0), (x1, y1) in itertools.pairwise(good):
                canvas.line(sx(x0), sy(y0), sx(x1), sy(y1), color, thick=2)
            for x, y in good:
                for d in range(-3, 4):
                    canvas.line(sx(x) - 3, sy(y) + d, sx(x) + 3, sy(y) + d, color)
    return encode_png(canvas.w, canvas.h, [bytes(r) for r in canvas.px])
