"""A quantized KV cache: integer codes plus scales, dequantized on read.

Each group of numbers that shares a scale is stored as

    x ~ lo + scale * code,   code in 0 .. 2**bits - 1,   scale = (max - min) / (2**bits - 1),   lo = min

(asymmetric quantization with a minimum, as KIVI does, arXiv 2402.02750), so no number is off by more than
half a step, scale / 2. Which numbers share a scale is the whole design question:
  per token    one scale per `group` channels of one token (values always; keys when key_scales="token");
  per channel  one scale per channel over a block of `block` tokens (keys, key_scales="channel", KIVI's choice):
               a few key channels are far larger than the rest, and a per-token scale sized for them rounds
               every other channel of that token to a handful of levels.
Per-channel blocks need `block` tokens before they can be scaled, so the newest keys wait in float (the cache's
dtype) until their block fills, as in KIVI. Codes of fewer than 8 bits are packed, 8 // bits to a byte.
"""
import numpy as np

from kvlesson import validate
from kvlesson.cache import Cache, float_dtype

BITS = (2, 4, 8)


def quantize(x, bits, axis, dtype=None):
    """x [..., n, ...] -> (codes uint8 like x, scale, lo): the n numbers along `axis` share one (scale, lo), kept
    there as a size-1 axis, stored in `dtype` (default: x's dtype). The codes are chosen for the stored scale and
    minimum, so each number comes back within half a step of itself (plus the rounding of lo to `dtype`). A group
    whose numbers are all equal gets scale 1 and code 0, so it comes back exact instead of as 0/0.
    """
    x, bits = validate.floats("x", x), _bits(bits)
    dtype = x.dtype if dtype is None else np.dtype(dtype)
    if x.size and not np.isfinite(x).all():
        raise ValueError("x must be finite to be quantized; got nan or inf")
    levels = 2**bits - 1
    lo = x.min(axis=axis, keepdims=True).astype(dtype)
    span = x.max(axis=axis, keepdims=True) - lo
    scale = np.where(span > 0, span / levels, 1).astype(dtype)  # cast: float32 stays float32
    codes = np.clip(np.rint((x - lo) / scale), 0, levels).astype(np.uint8)
    return codes, scale, lo


def dequantize(codes, scale, lo, dtype=None):
    """codes, scale, lo -> lo + scale * code, in `dtype` (default: the dtype of scale)."""
    dtype = scale.dtype if dtype is None else np.dtype(dtype)
    return lo.astype(dtype, copy=False) + codes.astype(dtype) * scale.astype(dtype, copy=False)


def pack(codes, bits):
    """uint8 [..., n] codes below 2**bits -> uint8 [..., n * bits / 8]: 8 // bits codes per byte, lowest first."""
    bits, codes = _bits(bits), np.asarray(codes)
    per = 8 // bits
    if codes.dtype != np.uint8 or codes.ndim == 0 or codes.shape[-1] % per or (codes >> bits).any():
        raise ValueError(f"pack needs uint8 codes below 2**{bits} in a last axis that is a multiple of {per}; got "
                         f"{codes.dtype} {codes.shape}")
    shifts = np.arange(0, 8, bits, dtype=np.uint8)  # [per]
    grouped = codes.reshape(*codes.shape[:-1], codes.shape[-1] // per, per)
    return np.bitwise_or.reduce(grouped << shifts, axis=-1).astype(np.uint8)


def unpack(packed, bits):
    """The inverse of pack: uint8 [..., m] -> uint8 [..., m * 8 / bits]."""
    bits, packed = _bits(bits), np.asarray(packed)
    if packed.dtype != np.uint8 or packed.ndim == 0:
        raise ValueError(f"unpack needs a uint8 array of packed codes; got {packed.dtype} {packed.shape}")
    shifts = np.arange(0, 8, bits, dtype=np.uint8)
    codes = (packed[..., None] >> shifts) & np.uint8(2**bits - 1)  # [..., m, per]
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * shifts.size)


def _bits(bits):
    bits = validate.integer("bits", bits)
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}; got bits={bits}")
    return bits


class _Rows:
    """Per-token quantized rows [Hkv, S, d]: one (scale, lo) per `group` channels of each token."""

    def __init__(self, Hkv, d, bits, group, dtype, scale_dtype):
        self.d, self.bits, self.group, self.dtype = d, bits, group, dtype
        self.codes = np.zeros((Hkv, 0, d * bits // 8), np.uint8)  # [Hkv, S, d * bits / 8]
        self.scale = np.zeros((Hkv, 0, d // group, 1), scale_dtype)  # [Hkv, S, d / group, 1]
        self.lo = np.zeros((Hkv, 0, d // group, 1), scale_dtype)

    def add(self, x):  # x [Hkv, T, d]
        Hkv, T, d = x.shape
        codes, scale, lo = quantize(x.reshape(Hkv, T, d // self.group, self.group), self.bits, axis=-1,
                                    dtype=self.scale.dtype)
        self.codes = np.concatenate([self.codes, pack(codes.reshape(Hkv, T, d), self.bits)], axis=1)
        self.scale = np.concatenate([self.scale, scale], axis=1)
        self.lo = np.concatenate([self.lo, lo], axis=1)

    def truncate(self, n):  # keep the first n tokens
        self.codes, self.scale, self.lo = self.codes[:, :n].copy(), self.scale[:, :n].copy(), self.lo[:, :n].copy()

    oldest = 0  # every row has its own scales, so any prefix is exactly what was stored for it

    def read(self):  # -> [Hkv, S, d]
        Hkv, S = self.codes.shape[:2]
        codes = unpack(self.codes, self.bits).reshape(Hkv, S, self.d // self.group, self.group)
        return dequantize(codes, self.scale, self.lo, self.dtype).reshape(Hkv, S, self.d)

    @property
    def nbytes(self):
        return self.codes.nbytes + self.scale.nbytes + self.lo.nbytes


class _Channels:
    """Per-channel quantized keys: blocks of `block` tokens, one (scale, lo) per channel of each block.

    Keys wait in float (`self.pending`) until their block is full; then the whole block is quantized at once.
    """

    def __init__(self, Hkv, d, bits, block, dtype, scale_dtype):
        self.d, self.bits, self.block, self.dtype = d, bits, block, dtype
        self.codes = np.zeros((Hkv, 0, d * bits // 8), np.uint8)  # [Hkv, blocks * block, d * bits / 8]
        self.scale = np.zeros((Hkv, 0, 1, d), scale_dtype)  # [Hkv, blocks, 1, d]
        self.lo = np.zeros((Hkv, 0, 1, d), scale_dtype)
        self.pending = np.zeros((Hkv, 0, d), dtype)  # [Hkv, < block, d], the newest keys, in float

    def add(self, x):  # x [Hkv, T, d]
        Hkv, _, d = x.shape
        waiting = np.concatenate([self.pending, x], axis=1)
        full = waiting.shape[1] // self.block * self.block
        blocks = waiting[:, :full].reshape(Hkv, full // self.block, self.block, d)
        codes, scale, lo = quantize(blocks, self.bits, axis=2, dtype=self.scale.dtype)  # over the block's tokens
        self.codes = np.concatenate([self.codes, pack(codes.reshape(Hkv, full, d), self.bits)], axis=1)
        self.scale = np.concatenate([self.scale, scale], axis=1)
        self.lo = np.concatenate([self.lo, lo], axis=1)
        self.pending = waiting[:, full:].copy()

    @property
    def oldest(self):
        """A quantized block's scales came from all its tokens, so a rollback may cut only the keys still waiting."""
        return self.codes.shape[1]

    def truncate(self, n):
        self.pending = self.pending[:, : n - self.oldest].copy()

    def read(self):  # -> [Hkv, S, d]
        Hkv, n = self.codes.shape[:2]
        codes = unpack(self.codes, self.bits).reshape(Hkv, n // self.block, self.block, self.d)
        done = dequantize(codes, self.scale, self.lo, self.dtype).reshape(Hkv, n, self.d)
        return np.concatenate([done, self.pending], axis=1)

    @property
    def nbytes(self):
        return self.codes.nbytes + self.scale.nbytes + self.lo.nbytes + self.pending.nbytes


class QuantizedKVCache(Cache):
    """A KV cache that stores `bits`-bit codes and scales, and hands back K, V dequantized in `dtype`.

    bits        2, 4 or 8
    key_scales  "token": each key gets one scale per `group` channels, like each value;
                "channel": keys get one scale per channel per `block` tokens (values stay per token)
    group       channels sharing one scale in a per-token row (default d: one scale per token and KV head)
    block       tokens sharing one scale per channel, for per-channel keys
    scale_dtype what the scales and minimums are stored in (default: dtype). A float64 cache with float32 scales
                holds the bytes a float32 one would (lesson 11 measures in float64); np.float16 halves their share
    nbytes      packed codes plus scales and minimums, plus any keys still waiting in float (in dtype)
    """

    def __init__(self, Hkv, d, bits=8, *, key_scales="token", group=None, block=32, dtype=np.float32,
                 scale_dtype=None):
        super().__init__(Hkv, d, dtype)
        scale_dtype = self.dtype if scale_dtype is None else float_dtype(scale_dtype)
        bits = _bits(bits)
        if key_scales not in ("token", "channel"):
            raise ValueError(f'key_scales must be "token" or "channel"; got key_scales={key_scales!r}')
        group = d if group is None else validate.integer("group", group, minimum=1)
        block = validate.integer("block", block, minimum=1)
        if d % group:
            raise ValueError(f"group={group} must divide the head dim d={d}")
        if d * bits % 8:
            raise ValueError(f"{8 // bits} codes of {bits} bits share a byte, so d={d} must be a multiple of "
                             f"{8 // bits}")
        self.bits, self.key_scales, self.group, self.block = bits, key_scales, group, block
        if key_scales == "token":
            self.keys = _Rows(Hkv, d, bits, group, self.dtype, scale_dtype)
        else:
            self.keys = _Channels(Hkv, d, bits, block, self.dtype, scale_dtype)
        self.values = _Rows(Hkv, d, bits, group, self.dtype, scale_dtype)

    def append(self, k_new, v_new):
        """[Hkv, T, d] each -> (K, V) [Hkv, S, d]: every key and value so far, dequantized, oldest first."""
        k_new, v_new, T = self._check(k_new, v_new)
        if not (np.isfinite(k_new).all() and np.isfinite(v_new).all()):
            raise ValueError("a quantized cache stores finite numbers only; k_new or v_new has nan or inf")
        self.keys.add(k_new)
        self.values.add(v_new)
        self._seen += T
        return self.keys.read(), self.values.read()

    def truncate(self, n):
        """Keep the first n positions. Per-token rows allow any n; per-channel keys only down to the first key still
        waiting in float, because a block's scales were set by every token in it."""
        n = self._check_truncate(n, self.keys.oldest)
        self.keys.truncate(n)
        self.values.truncate(n)
        self._seen = n

    @property
    def nbytes(self):
        return self.keys.nbytes + self.values.nbytes
