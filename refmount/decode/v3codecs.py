"""A Zarr v3 chunk's codecs run within bounds (``-o decode``): ``V3Chain``.

A v3 array's codecs are, in encoding order, array-to-array codecs (``transpose``,
``numcodecs.delta``, ``numcodecs.fixedscaleoffset``, ``numcodecs.astype``,
``numcodecs.quantize``, ``numcodecs.bitround``, ``numcodecs.packbits``), one array-to-bytes
codec (``bytes`` with its ``endian``, or ``numcodecs.pcodec``/``numcodecs.zfpy``; sharding is
``decode/sharding.py``'s), then bytes-to-bytes codecs (``gzip``, ``zstd``, ``blosc``,
``crc32c``, and every ``numcodecs.*`` one: ``numcodecs.zlib``, ``numcodecs.shuffle``,
``numcodecs.lz4``, ``numcodecs.crc32`` ...). A chunk decodes as zarr-python 3 decodes it:
the bytes-to-bytes codecs reversed, the bytes viewed as the array (after its array codecs)
in the ``bytes`` codec's byte order, in C order, then the array codecs reversed (each
``numcodecs`` one given the array and its output reshaped, as zarr's ``numcodecs.*``
wrappers do; ``transpose`` undone); the result is the chunk in C order, little-endian.

Every codec is numcodecs' own (the v3 names map to numcodecs' ids: ``gzip`` is ``GZip``,
``crc32c`` is ``CRC32C``, which checks and strips the checksum); each step is bounded as for
v2 (``chunkcodecs.decode_step``: streaming decompressors stop one byte past their bound,
blosc's header is checked, the other filters' sizes before they run), the bound of each step
the most the next step's input can be (``encoded_bound``). A chain with a codec off the
allow-list runs in a codec worker process (``spec``/``chain_from_spec``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refmount.decode.chunkcodecs import BoundError, ChunkCodecs, allowed, decode_step, encoded_bound
from refmount.decode.zarrv3 import V3Error, codec_config, codec_name

ARRAY_ARRAY = frozenset({"delta", "fixedscaleoffset", "astype", "quantize", "bitround", "packbits"})
ARRAY_BYTES = frozenset({"pcodec", "zfpy"})
_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
VARIABLE = frozenset({"vlen-utf8", "vlen-bytes", "numcodecs.vlen-utf8", "numcodecs.vlen-bytes",
                      "numcodecs.vlen-array", "numcodecs.json2", "numcodecs.msgpack2",
                      "numcodecs.pickle", "numcodecs.categorize"})


def numcodec(codec: Any) -> Any:
    """The numcodecs codec of a v3 bytes-to-bytes, numcodecs array or ``numcodecs.*`` codec."""
    import numcodecs

    name, conf = codec_name(codec), codec_config(codec)
    if name in VARIABLE:
        raise V3Error(f"codec {name!r} makes variable-length values")
    if name.startswith("numcodecs."):
        cfg = {**conf, "id": name.removeprefix("numcodecs.")}
    elif name == "gzip":
        cfg = {"id": "gzip", "level": conf.get("level", 1)}
    elif name == "zstd":
        cfg = {"id": "zstd", "level": conf.get("level", 0), "checksum": bool(conf.get("checksum", False))}
    elif name == "crc32c":
        cfg = {"id": "crc32c"}
    elif name == "blosc":
        shuffle = conf.get("shuffle", "noshuffle")
        cfg = {"id": "blosc", "cname": conf.get("cname", "lz4"), "clevel": conf.get("clevel", 5),
               "shuffle": _SHUFFLE.get(shuffle, shuffle) if isinstance(shuffle, str) else shuffle,
               "blocksize": conf.get("blocksize", 0)}
    else:
        raise V3Error(f"codec {name!r} is not known to the decoded view")
    try:
        return numcodecs.get_codec(cfg)
    except Exception as e:  # not installed (ValueError), or a bad configuration
        raise V3Error(f"codec {name!r} not available ({type(e).__name__}: {e})") from None


def _retyped(codec: Any, conf: dict[str, Any], dt: np.dtype, shape: tuple[int, ...],
             ) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape an array codec encodes ``dt``/``shape`` to, as zarr-python 3
    resolves them (``delta`` and ``fixedscaleoffset`` change the dtype only with ``astype``
    in their configuration)."""
    cid = codec.codec_id
    if cid == "astype":
        return np.dtype(codec.encode_dtype), shape
    if cid in ("delta", "fixedscaleoffset"):
        return (np.dtype(conf["astype"]) if conf.get("astype") else dt), shape
    if cid == "packbits":
        return np.dtype("u1"), (1 + math.ceil(math.prod(shape) / 8),)
    return dt, shape


@dataclass
class V3Chain:
    """One chunk's decoding: ``codecs`` (v3, encoding order, no sharding) of a chunk of
    ``shape`` and ``dtype`` (native)."""

    codecs: list[Any]
    dtype: np.dtype
    shape: tuple[int, ...]
    ceiling: int | None = None  # the bound of a step after a codec whose sizes are not known
    steps: list[tuple[str, Any, Any]] = field(init=False)  # decoding order: (kind, what, limit)
    nbytes: int = field(init=False)  # decoded chunk size

    def __post_init__(self) -> None:
        self.dtype = np.dtype(self.dtype).newbyteorder("=")
        self.out_dtype = self.dtype.newbyteorder("<")
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        arrays: list[tuple[str, Any, Any]] = []  # encoding order: (kind, codec or order, (dt, shape) in)
        dt, shape = self.dtype, tuple(self.shape)
        serializer: tuple[str, Any] | None = None
        after: list[Any] = []
        for codec in self.codecs:
            name = codec_name(codec)
            bare = name.removeprefix("numcodecs.")
            if serializer is None:
                if name == "transpose":
                    order = codec_config(codec).get("order")
                    if not isinstance(order, list) or sorted(order) != list(range(len(shape))):
                        raise V3Error(f"transpose order {order!r} is not a permutation of the axes")
                    arrays.append(("transpose", tuple(order), (dt, shape)))
                    shape = tuple(shape[i] for i in order)
                elif name.startswith("numcodecs.") and bare in ARRAY_ARRAY:
                    nc = numcodec(codec)
                    arrays.append(("numcodec", nc, (dt, shape)))
                    dt, shape = _retyped(nc, codec_config(codec), dt, shape)
                elif name == "bytes":
                    endian = codec_config(codec).get("endian", "little")
                    if endian not in ("little", "big"):
                        raise V3Error(f"bytes codec endian {endian!r}")
                    serializer = ("bytes", endian)
                elif name.startswith("numcodecs.") and bare in ARRAY_BYTES:
                    serializer = ("numcodec", numcodec(codec))
                elif name == "sharding_indexed":
                    raise V3Error("sharding_indexed inside a shard, or after other codecs")
                else:
                    raise V3Error(f"codec {name!r} is not an array codec, and no bytes codec precedes it")
            else:
                after.append(numcodec(codec))
        if serializer is None:
            raise V3Error("no array-to-bytes codec (bytes)")
        self._encoded = (dt, shape)
        # bounds, in encoding order: the size each step takes in
        size: int | None = self.nbytes
        bounds: list[int | None] = []
        for kind, what, _spec in arrays:
            bounds.append(size)
            if kind == "numcodec" and size is not None:
                b = encoded_bound(what, size)
                size = self.ceiling if b is None else b
        serial_in = size
        if serializer[0] == "numcodec":
            size = self.ceiling  # a compressor of its own (pcodec, zfpy): not known
        byte_bounds: list[int | None] = []
        for codec in after:
            byte_bounds.append(size)
            b = None if size is None else encoded_bound(codec, size)
            size = self.ceiling if b is None else b
        self.stored_bound = size  # the most stored bytes a chunk can be (None: not known)
        self.steps = [("bytes", c, lim)
                      for c, lim in zip(reversed(after), reversed(byte_bounds), strict=True)]
        self.steps.append(("serializer", serializer, serial_in))
        self.steps += [(kind, (what, spec), lim) for (kind, what, spec), lim
                       in zip(reversed(arrays), reversed(bounds), strict=True)]

    @property
    def codec_objects(self) -> list[Any]:
        out = []
        for kind, what, _lim in self.steps:
            if kind == "bytes":
                out.append(what)
            elif kind == "serializer" and what[0] == "numcodec":
                out.append(what[1])
            elif kind == "numcodec":
                out.append(what[0])
        return out

    @property
    def isolated(self) -> bool:
        """True when a codec outside the allow-list takes part: decoded in a worker process."""
        return not all(allowed(c) for c in self.codec_objects)

    @property
    def peak(self) -> int:
        return max([lim for _k, _w, lim in self.steps if lim is not None] + [self.nbytes])

    def decode(self, stored: Any) -> memoryview:
        """The decoded chunk (C order, little-endian). ValueError naming the failing step."""
        from numcodecs.compat import ensure_ndarray_like

        stage = "stored bytes"
        try:
            buf: Any = stored
            arr: Any = None
            for kind, what, limit in self.steps:
                if kind == "bytes":
                    stage = what.codec_id
                    buf = decode_step(what, buf, limit)
                elif kind == "serializer":
                    dt, shape = self._encoded
                    if what[0] == "bytes":
                        stage = f"bytes ({what[1]})"
                        data = ensure_ndarray_like(buf).view(np.uint8).reshape(-1)
                        want = math.prod(shape) * dt.itemsize
                        if data.nbytes != want:
                            raise ValueError(f"{data.nbytes} bytes, expected {want}")
                        order = ">" if what[1] == "big" else "<"
                        arr = data.view(dt.newbyteorder(order) if dt.itemsize > 1 else dt)
                    else:
                        stage = what[1].codec_id
                        arr = ensure_ndarray_like(decode_step(what[1], buf, limit)).view(dt)
                    arr = arr.reshape(shape)
                    if arr.dtype.byteorder == ">":
                        arr = arr.astype(arr.dtype.newbyteorder("="))
                elif kind == "transpose":
                    order, _spec = what
                    stage = "transpose"
                    arr = arr.transpose(np.argsort(order))
                else:
                    codec, (dt, shape) = what
                    stage = codec.codec_id
                    out = ensure_ndarray_like(decode_step(codec, arr, limit))
                    arr = out.view(dt).reshape(shape)
            stage = "view as " + self.dtype.str
            arr = np.asarray(arr)
            if arr.dtype.hasobject:
                raise ValueError("decoded to objects")
            if arr.dtype != self.dtype:
                same = arr.dtype.itemsize == self.dtype.itemsize
                arr = arr.view(self.dtype) if same else arr.astype(self.dtype)
        except BoundError:
            raise
        except Exception as e:
            raise ValueError(f"{stage}: {type(e).__name__}: {e}") from None
        if arr.nbytes != self.nbytes:
            raise ValueError(f"decoded to {arr.nbytes} bytes, expected {self.nbytes}")
        if arr.dtype != self.out_dtype:
            arr = arr.astype(self.out_dtype)
        return memoryview(np.ascontiguousarray(arr).view(np.uint8).reshape(-1)).cast("B")

    # ---- as sent to a codec worker ------------------------------------------------------------
    def spec(self) -> bytes:
        """What a codec worker needs to build this decoding (JSON)."""
        return json.dumps({"v3": {"codecs": self.codecs, "dtype": self.dtype.str, "shape": list(self.shape),
                                  "ceiling": self.ceiling}}, sort_keys=True).encode()


def chain_from_spec(spec: bytes) -> V3Chain | ChunkCodecs:
    """A chunk's decoding from a codec worker's request: v2's ``ChunkCodecs`` or a ``V3Chain``."""
    obj = json.loads(spec)
    v3 = obj.get("v3") if isinstance(obj, dict) else None
    if v3 is None:
        return ChunkCodecs.from_spec(spec)
    shape = tuple(int(n) for n in v3["shape"])
    if math.prod(shape) > 2**40:
        raise ValueError("bad chunk shape")
    ceiling = v3.get("ceiling")
    return V3Chain(v3["codecs"], np.dtype(v3["dtype"]), shape, None if ceiling is None else int(ceiling))
