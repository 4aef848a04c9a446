"""Sizes as people write them in tpubuild.yaml and on the command line: `500M`, `2G`, `1024`."""

from __future__ import annotations


def parse_size(text: str) -> int:
    """`500M`, `2G`, `1024` -> bytes."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    return int(float(number) * units[unit])
