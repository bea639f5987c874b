"""A quantized KV cache: integer codes plus scales, dequantized on read.

Each group of numbers that shares a scale is stored as

    x ~ lo + scale * code,   code in 0 .. 2**bits - 1,   scale = (max - min) / (2**bits - 1),   lo = min

(asymmetric quantization with a minimum, as KIVI does, arXiv 2402.02750), so no number is off by more than
half a step, scale / 2. Which numbers share a scale is the whole design question:
  per token    one scale per `group` channels of one token (values always; keys when key_scales="token");
  per channel  one scale per channel over a block of `block` tokens (keys, key_scales="channel", KIVI's choice):
               a few key channels are far larger than the rest, and a per-token scale sized for them rounds
               every other channel of that token to a handful of levels.
Two more choices, each a paper's:
  residual     every query reads the `residual` newest tokens, itself included, in the cache's dtype (KIVI keeps
               R = 128 of them); older ones it reads quantized
  rope_base    keys quantized before RoPE and rotated on the way out (KVQuant, arXiv 2401.18079). kvlesson.step
               hands the cache keys already rotated at their positions, so the cache turns each one back first.
A per-channel block needs all its tokens before it can be scaled, so a key is quantized only once its whole block
has left the residual. Until then it waits in the cache's dtype, and so does its value, from the same position on.

What a query reads does not depend on how the text was chunked. Query p reads key j quantized once j's block (per
token: j itself) is older than p's residual, and value j once j is; otherwise as it came. Within one append, queries
at different positions need different versions of the same token, so the cache hands back each version that some
query needs and mask(T) shows every query its own: a chunked prefill equals token-by-token decode, and the tests
compare it with one full pass. Codes of fewer than 8 bits are packed, 8 // bits to a byte.
"""
import numpy as np

from kvlesson import validate
from kvlesson.cache import Cache, float_dtype
from kvlesson.rope import apply_rope

BITS = (2, 4, 8)


def quantize(x, bits, axis, dtype=None):
    """x [..., n, ...] -> (codes uint8 like x, scale, lo): the n numbers along `axis` share one (scale, lo), kept
    there as a size-1 axis, stored in `dtype` (default: x's dtype). The codes are chosen for the stored scale and
    minimum, so each number comes back within half a step of itself (plus the rounding of lo to `dtype`). A group
    whose numbers are all equal gets scale 1 and code 0, so it comes back exact instead of as 0/0.

    The arithmetic runs in float64, which holds every float16, float32 and float64 number exactly: max - min of
    float32 numbers near the ends of their range would overflow float32 (and come back as nan). A scale or minimum
    that does not fit `dtype` is refused by name.
    """
    x, bits = validate.floats("x", x), _bits(bits)
    dtype = x.dtype if dtype is None else float_dtype(dtype)
    if x.size and not np.isfinite(x).all():
        raise ValueError("x must be finite to be quantized; got nan or inf")
    levels = 2**bits - 1
    wide = x.astype(np.float64, copy=False)
    lo = _stored(wide.min(axis=axis, keepdims=True), dtype, "minimum")
    span = wide.max(axis=axis, keepdims=True) - lo  # from the stored minimum, so the top code reaches the max
    scale = _stored(np.where(span > 0, span / levels, 1.0), dtype, "scale")
    codes = np.clip(np.rint((wide - lo) / scale), 0, levels).astype(np.uint8)
    return codes, scale, lo


def dequantize(codes, scale, lo, dtype=None):
    """codes, scale, lo -> lo + scale * code, in `dtype` (default: the dtype of scale).

    Computed in float64 and rounded once to `dtype`: scale * code can exceed the largest float32 where lo + scale *
    code does not (numbers of both signs near the ends of the range).
    """
    dtype = scale.dtype if dtype is None else np.dtype(dtype)
    wide = lo.astype(np.float64, copy=False) + codes.astype(np.float64) * scale.astype(np.float64, copy=False)
    if dtype != np.float64:  # one rounding of the top code may land a hair past the largest finite number
        top = float(np.finfo(dtype).max)
        wide = np.clip(wide, -top, top)
    return wide.astype(dtype, copy=False)


def _stored(a, dtype, what):
    """float64 scales or minimums -> `dtype`, refusing any that do not fit."""
    with np.errstate(over="ignore"):  # an overflow is reported below, by name
        out = a.astype(dtype)
    if not np.isfinite(out).all():
        raise ValueError(f"numbers up to {np.abs(a).max():.3g} give a {what} that {np.dtype(dtype).name} cannot hold "
                         f"(largest {float(np.finfo(dtype).max):.3g}): store scales in a wider dtype")
    return out


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


class _Codes:
    """Quantized tokens [Hkv, n, d] as packed codes plus scales. A subclass says which numbers share a scale.

    encode(x) -> an encoding of the tokens x [Hkv, m, d] (m a whole number of units), decode(enc) -> [Hkv, m, d],
    first(enc, m) -> the encoding of its first m tokens; add(enc) stores one, read() decodes all that is stored.
    """

    unit = 1  # tokens that are quantized together

    def __init__(self, Hkv, d, bits, dtype, scale_dtype):
        self.d, self.bits, self.dtype, self.scale_dtype = d, bits, dtype, scale_dtype
        self.stored = self.encode(np.zeros((Hkv, 0, d), dtype))

    def add(self, enc):
        self.stored = tuple(np.concatenate([a, b], axis=1) for a, b in zip(self.stored, enc, strict=True))

    def read(self):
        return self.decode(self.stored)

    def truncate(self, n):
        self.stored = tuple(a.copy() for a in self.first(self.stored, n))

    @property
    def scale(self):
        return self.stored[1]

    @property
    def nbytes(self):
        return sum(a.nbytes for a in self.stored)


class _Rows(_Codes):
    """Per token: one (scale, lo) per `group` channels of each token; scales [Hkv, n, d / group, 1]."""

    def __init__(self, Hkv, d, bits, group, dtype, scale_dtype):
        self.group = group
        super().__init__(Hkv, d, bits, dtype, scale_dtype)

    def encode(self, x):
        Hkv, m, d = x.shape
        groups = x.reshape(Hkv, m, d // self.group, self.group)
        if m == 0:
            empty = np.zeros((Hkv, 0, d // self.group, 1), self.scale_dtype)
            return np.zeros((Hkv, 0, d * self.bits // 8), np.uint8), empty, empty.copy()
        codes, scale, lo = quantize(groups, self.bits, axis=-1, dtype=self.scale_dtype)
        return pack(codes.reshape(Hkv, m, d), self.bits), scale, lo

    def decode(self, enc):
        packed, scale, lo = enc
        Hkv, m = packed.shape[:2]
        codes = unpack(packed, self.bits).reshape(Hkv, m, self.d // self.group, self.group)
        return dequantize(codes, scale, lo, self.dtype).reshape(Hkv, m, self.d)

    def first(self, enc, m):
        return tuple(a[:, :m] for a in enc)


class _Blocks(_Codes):
    """Per channel: one (scale, lo) per channel of each block of `unit` tokens; scales [Hkv, blocks, 1, d]."""

    def __init__(self, Hkv, d, bits, block, dtype, scale_dtype):
        self.unit = block
        super().__init__(Hkv, d, bits, dtype, scale_dtype)

    def encode(self, x):
        Hkv, m, d = x.shape
        if m == 0:
            empty = np.zeros((Hkv, 0, 1, d), self.scale_dtype)
            return np.zeros((Hkv, 0, d * self.bits // 8), np.uint8), empty, empty.copy()
        blocks = x.reshape(Hkv, m // self.unit, self.unit, d)
        codes, scale, lo = quantize(blocks, self.bits, axis=2, dtype=self.scale_dtype)  # over each block's tokens
        return pack(codes.reshape(Hkv, m, d), self.bits), scale, lo

    def decode(self, enc):
        packed, scale, lo = enc
        Hkv, m = packed.shape[:2]
        codes = unpack(packed, self.bits).reshape(Hkv, m // self.unit, self.unit, self.d)
        return dequantize(codes, scale, lo, self.dtype).reshape(Hkv, m, self.d)

    def first(self, enc, m):
        packed, scale, lo = enc
        return packed[:, :m], scale[:, : m // self.unit], lo[:, : m // self.unit]


class QuantizedKVCache(Cache):
    """A KV cache that stores `bits`-bit codes and scales, and hands back K, V dequantized in `dtype`.

    bits        2, 4 or 8
    key_scales  "token": each key gets one scale per `group` channels, like each value;
                "channel": keys get one scale per channel per `block` tokens (values stay per token)
    group       channels sharing one scale in a per-token row (default d: one scale per token and KV head)
    block       tokens sharing one scale per channel, for per-channel keys
    residual    R: every query reads the R newest tokens, itself included, unquantized (KIVI's full-precision
                residual); R = 0 quantizes a token as soon as it can be
    rope_base   the model's RoPE base, to quantize keys before RoPE (KVQuant); `interleaved` names its pairing
    scale_dtype what the scales and minimums are stored in (default: dtype). A float64 cache with float32 scales
                holds the codes and scales a float32 one would (lesson 11 measures in float64); np.float16 halves
                their share
    nbytes      packed codes plus scales and minimums, plus the tokens still waiting unquantized (in dtype)
    """

    def __init__(self, Hkv, d, bits=8, *, key_scales="token", group=None, block=32, residual=0, rope_base=None,
                 interleaved=False, dtype=np.float32, scale_dtype=None):
        super().__init__(Hkv, d, dtype)
        scale_dtype = self.dtype if scale_dtype is None else float_dtype(scale_dtype)
        bits = _bits(bits)
        if key_scales not in ("token", "channel"):
            raise ValueError(f'key_scales must be "token" or "channel"; got key_scales={key_scales!r}')
        group = d if group is None else validate.integer("group", group, minimum=1)
        block = validate.integer("block", block, minimum=1)
        self.residual = validate.integer("residual", residual)
        self.rope_base = None if rope_base is None else validate.positive("rope_base", rope_base)
        if d % group:
            raise ValueError(f"group={group} must divide the head dim d={d}")
        if d * bits % 8:
            raise ValueError(f"{8 // bits} codes of {bits} bits share a byte, so d={d} must be a multiple of "
                             f"{8 // bits}")
        if self.rope_base is not None and d % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions, so d must be even to undo it; got d={d}")
        self.bits, self.key_scales, self.group, self.block = bits, key_scales, group, block
        self.interleaved = bool(interleaved)
        if key_scales == "token":
            self.keys = _Rows(Hkv, d, bits, group, self.dtype, scale_dtype)
        else:
            self.keys = _Blocks(Hkv, d, bits, block, self.dtype, scale_dtype)
        self.values = _Rows(Hkv, d, bits, group, self.dtype, scale_dtype)
        self.coded = 0  # positions 0 .. coded - 1 are stored as codes, the rest as they came
        self.k_waiting = np.zeros((Hkv, 0, d), self.dtype)  # [Hkv, seen - coded, d], keys as step rotated them
        self.v_waiting = np.zeros((Hkv, 0, d), self.dtype)

    # --- which version each query reads: all of it follows from positions alone

    def _value_frontier(self, p):
        """Query p reads values j < this quantized: all but its `residual` newest."""
        return max(p + 1 - self.residual, 0)

    def _key_frontier(self, p):
        """Query p reads keys j < this quantized: whole blocks (per token: single keys) older than its residual."""
        unit = self.keys.unit
        return self._value_frontier(p) // unit * unit

    def _start(self, n):
        """After n tokens, positions below this are stored as codes: nothing a later query reads unquantized, and
        only whole blocks (a block's scales need every one of its tokens)."""
        unit = self.keys.unit
        return max(n + 1 - max(self.residual, 1), 0) // unit * unit

    def _segments(self, n, T):
        """For the queries at n .. n + T - 1 -> (a, b0, b1, c0): what append hands back, in three segments:
        keys and values quantized at positions 0 .. a - 1, keys as they came with values quantized at b0 .. b1 - 1
        (a per-channel block still waiting), both as they came at c0 .. n + T - 1 (empty when residual = 0)."""
        if T == 0:
            return 0, 0, 0, n
        last = n + T - 1
        a, b0 = self._key_frontier(last), self._key_frontier(n)
        b1 = self._value_frontier(last) if self.keys.unit > 1 else b0  # per token, no query reads a mixed version
        c0 = self._value_frontier(n) if self.residual else n + T
        return a, b0, max(b0, b1), c0

    # --- the protocol

    def append(self, k_new, v_new):
        """[Hkv, T, d] each -> (K, V) [Hkv, S, d]: every version of every token some new query reads (see mask)."""
        k_new, v_new, T = self._check(k_new, v_new)
        if not (np.isfinite(k_new).all() and np.isfinite(v_new).all()):
            raise ValueError("a quantized cache stores finite numbers only; k_new or v_new has nan or inf")
        n, coded = self._seen, self.coded
        k_all = np.concatenate([self.k_waiting, k_new], axis=1)  # [Hkv, n + T - coded, d]: positions coded ..
        v_all = np.concatenate([self.v_waiting, v_new], axis=1)
        a, b0, b1, c0 = self._segments(n, T)
        new_coded = self._start(n + T)
        # encode first: a scale that does not fit is refused here, before any state moves
        k_enc = self.keys.encode(self._unrotate(k_all[:, : new_coded - coded], coded))
        v_enc = self.values.encode(v_all[:, : max(new_coded, b1) - coded])
        K_q = np.concatenate([self.keys.read(), self.keys.decode(k_enc)], axis=1)[:, :a]  # [Hkv, a, d]
        V_q = np.concatenate([self.values.read(), self.values.decode(v_enc)], axis=1)
        K = [self._rotate(K_q), k_all[:, b0 - coded : b1 - coded], k_all[:, c0 - coded :]]
        V = [V_q[:, :a], V_q[:, b0:b1], v_all[:, c0 - coded :]]
        self.keys.add(k_enc)
        self.values.add(self.values.first(v_enc, new_coded - coded))
        self.k_waiting = k_all[:, new_coded - coded :].copy()
        self.v_waiting = v_all[:, new_coded - coded :].copy()
        self.coded, self._seen = new_coded, n + T
        return np.concatenate(K, axis=1), np.concatenate(V, axis=1)

    def mask(self, T):
        """-> bool [T, S] over what the append of the T newest tokens handed back: query p sees the quantized version
        of key j below its key frontier, the mixed one (key as it came, value quantized) up to its value frontier,
        and the unquantized one from there to itself."""
        T = validate.integer("T", T)
        n = len(self) - T
        if n < 0:
            raise ValueError(f"T={T}: the cache has seen only {len(self)} tokens")
        a, b0, b1, c0 = self._segments(n, T)
        p = np.arange(n, n + T)[:, None]  # [T, 1] query positions
        value_front = np.maximum(p + 1 - self.residual, 0)  # [T, 1], as _value_frontier
        key_front = value_front // self.keys.unit * self.keys.unit  # as _key_frontier
        quantized = np.arange(a)[None, :] < key_front  # [T, a]
        mixed = np.arange(b0, b1)[None, :]
        mixed = (mixed >= key_front) & (mixed < value_front)  # [T, b1 - b0]
        fresh = np.arange(c0, n + T)[None, :]
        fresh = (fresh >= value_front) & (fresh <= p)  # [T, n + T - c0]
        return np.concatenate([quantized, mixed, fresh], axis=1)

    def truncate(self, n):
        """Keep the first n positions: possible where a cache fed only n would have stored the same codes, i.e.
        when none of the tokens it needs unquantized has been quantized already (or n cuts at a stored block)."""
        n = self._check_truncate(n)
        if not self._can_roll_back(n):
            oldest = len(self)
            while oldest > 0 and self._can_roll_back(oldest - 1):
                oldest -= 1
            self._check_truncate(n, oldest)
        keep = self._start(n)
        if keep < self.coded:  # n is a block boundary below what is stored: drop whole coded blocks
            self.keys.truncate(n)
            self.values.truncate(n)
            self.k_waiting, self.v_waiting = self.k_waiting[:, :0].copy(), self.v_waiting[:, :0].copy()
            self.coded = n
        else:
            self.k_waiting = self.k_waiting[:, : n - self.coded].copy()
            self.v_waiting = self.v_waiting[:, : n - self.coded].copy()
        self._seen = n

    def _can_roll_back(self, n):
        start = self._start(n)
        return start == self.coded or (start == n and n <= self.coded)

    @property
    def nbytes(self):
        return self.keys.nbytes + self.values.nbytes + self.k_waiting.nbytes + self.v_waiting.nbytes

    # --- keys before RoPE (KVQuant)

    def _unrotate(self, k, start):
        """Keys at positions start .. as step rotated them -> as they were before RoPE (a rotation by -p)."""
        if self.rope_base is None or not k.shape[1]:
            return k
        return apply_rope(k, -np.arange(start, start + k.shape[1]), self.rope_base, interleaved=self.interleaved)

    def _rotate(self, k):
        """Dequantized keys at positions 0 .. -> rotated at their positions, as step would have."""
        if self.rope_base is None or not k.shape[1]:
            return k
        return apply_rope(k, np.arange(k.shape[1]), self.rope_base, interleaved=self.interleaved)
