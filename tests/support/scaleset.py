"""The scale benchmark's Version 0 set (``python -m bench run --workloads scale``): N keys in
about ten zarr-like arrays, chunk references into a few hundred sparse local target files,
its keys computable by index. Tests use it for a set whose parse peaks far above the serving
RSS."""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MiB = 1024 * 1024


@dataclass
class Layout:
    """Deterministic layout of the V0/Parquet reference set (keys computable by index)."""

    keys: int
    arrays: int
    targets: int
    target_dir: Path
    chunk_side: int = 100
    counts: list[int] = field(default_factory=list)  # chunks per array
    cols: list[int] = field(default_factory=list)  # chunk-grid columns per array

    def __post_init__(self) -> None:
        n_meta = 2 + 2 * self.arrays
        n_chunks = self.keys - n_meta
        if n_chunks < self.arrays:
            raise SystemExit(f"--keys must be at least {n_meta + self.arrays}")
        base, rem = divmod(n_chunks, self.arrays)
        self.counts = [base + (1 if k < rem else 0) for k in range(self.arrays)]
        self.cols = [math.ceil(math.sqrt(c)) for c in self.counts]

    def var(self, k: int) -> str:
        return f"var{k:02d}"

    def target(self, t: int) -> str:
        return str(self.target_dir / f"part-{t:04d}.nc")

    def rows(self, k: int) -> int:
        return math.ceil(self.counts[k] / self.cols[k])

    def zarray(self, k: int) -> str:
        s = self.chunk_side
        meta = {
            "chunks": [s, s],
            "compressor": {"id": "zlib", "level": 4},
            "dtype": "<f4",
            "fill_value": "NaN",
            "filters": None,
            "order": "C",
            "shape": [self.rows(k) * s, self.cols[k] * s],
            "zarr_format": 2,
        }
        return json.dumps(meta, indent=4)

    def meta_entries(self) -> list[tuple[str, str]]:
        out = [
            (".zattrs", json.dumps({"title": "refmount scale benchmark", "keys": self.keys}, indent=4)),
            (".zgroup", json.dumps({"zarr_format": 2}, indent=4)),
        ]
        for k in range(self.arrays):
            v = self.var(k)
            attrs = json.dumps({"_ARRAY_DIMENSIONS": [f"y{k}", f"x{k}"], "units": "K"}, indent=4)
            out += [(f"{v}/.zarray", self.zarray(k)), (f"{v}/.zattrs", attrs)]
        return out

    def chunk_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(target index, offset, length) of every chunk in generation order (array by array,
        C order), and each target's size. Chunk g goes to target g % targets, after the chunks
        before it in that target; its length is 20,000..59,999 bytes, pseudo-random."""
        total = sum(self.counts)
        g = np.arange(total, dtype=np.int64)
        lengths = 20_000 + (g * 2_654_435_761) % 40_000
        tgt = g % self.targets
        m = np.zeros(math.ceil(total / self.targets) * self.targets, np.int64)
        m[:total] = lengths
        m = m.reshape(-1, self.targets)
        offsets = (np.cumsum(m, axis=0) - m).reshape(-1)[:total]
        return tgt, offsets, lengths, m.sum(axis=0)

    def make_targets(self, sizes: np.ndarray) -> None:
        """Sparse target files of the right size: reads resolve (to zeros), no disk used."""
        self.target_dir.mkdir(parents=True, exist_ok=True)
        for t, size in enumerate(sizes.tolist()):
            with open(self.target(t), "ab") as tf:
                tf.truncate(size)

    def sample(self, n: int, meta_size, seed: int = 12345) -> list[tuple[str, int]]:
        """n random (key, expected st_size) pairs: 1% metadata keys, the rest chunk keys."""
        rng = random.Random(seed)
        meta = [(k, meta_size(text)) for k, text in self.meta_entries()]
        starts = [sum(self.counts[:k]) for k in range(self.arrays)]
        total = sum(self.counts)
        out = []
        for _ in range(n):
            if rng.random() < 0.01:
                out.append(rng.choice(meta))
                continue
            g = rng.randrange(total)
            k = max(i for i in range(self.arrays) if starts[i] <= g)
            i, j = divmod(g - starts[k], self.cols[k])
            out.append((f"{self.var(k)}/{i}.{j}", 20_000 + (g * 2_654_435_761) % 40_000))
        return out


def generate_v0(layout: Layout, path: Path) -> None:
    tgt, offsets, lengths, sizes = layout.chunk_columns()
    tmp = path.with_name(path.name + ".tmp")
    urls = [json.dumps(layout.target(t)) for t in range(layout.targets)]
    with open(tmp, "w", buffering=8 * MiB) as f:
        f.write("{\n")
        for key, text in layout.meta_entries():
            f.write(f"{json.dumps(key)}: {json.dumps(text)},\n")
        g0, first = 0, True
        for k in range(layout.arrays):
            v, cols, c = layout.var(k), layout.cols[k], layout.counts[k]
            for lo in range(0, c, 100_000):
                hi = min(lo + 100_000, c)
                tl = tgt[g0 + lo : g0 + hi].tolist()
                ol = offsets[g0 + lo : g0 + hi].tolist()
                ll = lengths[g0 + lo : g0 + hi].tolist()
                lines = [
                    f'"{v}/{idx // cols}.{idx % cols}": [{urls[tl[n]]}, {ol[n]}, {ll[n]}]'
                    for n, idx in enumerate(range(lo, hi))
                ]
                f.write(("" if first else ",\n") + ",\n".join(lines))
                first = False
            g0 += c
        f.write("\n}\n")
    os.replace(tmp, path)
    layout.make_targets(sizes)
