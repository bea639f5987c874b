"""Which corner does PyTorch's causal mask hang from? `python scripts/causal_corner.py`

Lesson 04's bug, np.tril(np.ones((T, S))), anchors the diagonal at the top-left corner, while T new queries
over S keys need it at the bottom right (query i at position S - T + i). This script measures which of the
two each PyTorch path applies, with T queries over S keys:

  - F.scaled_dot_product_attention(q, k, v, is_causal=True)
  - ... with attn_mask=torch.nn.attention.bias.causal_upper_left(T, S)
  - ... with attn_mask=torch.nn.attention.bias.causal_lower_right(T, S)

It does not read any documentation: it recovers the mask each path applies by nudging one value row at a
time (a query's output moves exactly when it gives that key a nonzero weight), then compares the recovered
mask with kvlesson.causal_mask(T, S) (the offset mask) and with np.tril(np.ones((T, S))) (the top-left one),
and each path's output with kvlesson.attention under the mask it matched (float64, tolerance 1e-12).

Needs torch, which kvlesson itself does not: run it with the reference install
(pip install -r requirements.txt -r requirements-reference.txt in a separate venv).
"""
import platform
import sys

import numpy as np

from kvlesson import attention, causal_mask

SHAPES = [(3, 7), (1, 5), (2, 9), (4, 4), (5, 6)]  # (T, S): the lesson's chunk, a decode step, ..., T == S
TOL = 1e-12  # float64 outputs of two implementations of the same sums agree to about 1e-15


def torch_paths(torch):
    """name -> fn(q, k, v) for each causal path of PyTorch; q [1, H, T, d], k, v [1, H, S, d] tensors."""
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    return {
        "is_causal=True": lambda q, k, v: sdpa(q, k, v, is_causal=True),
        "causal_upper_left": lambda q, k, v: sdpa(q, k, v, attn_mask=causal_upper_left(q.shape[-2], k.shape[-2])),
        "causal_lower_right": lambda q, k, v: sdpa(q, k, v, attn_mask=causal_lower_right(q.shape[-2], k.shape[-2])),
    }


def recovered_mask(torch, path, q, k, v):
    """bool [T, S]: which keys each query of `path` gives a nonzero weight, found by nudging each value row."""
    def run(v_):
        return path(*(torch.from_numpy(a[None]) for a in (q, k, v_)))[0].numpy()  # [H, T, d]

    base = run(v)
    T, S = q.shape[1], k.shape[1]
    seen = np.zeros((T, S), bool)
    for j in range(S):
        nudged = v.copy()
        nudged[:, j] += 1.0
        seen[:, j] = (np.abs(run(nudged) - base) > 1e-9).any(axis=(0, 2))
    return seen, base


def grid(mask):
    return ["".join("1" if x else "0" for x in row) for row in mask]


def main():
    try:
        import torch
    except ImportError:
        print("causal_corner.py needs torch, which kvlesson does not install. Run it with the reference install:\n"
              "  pip install -r requirements.txt -r requirements-reference.txt   (in a separate venv)\n"
              "  python scripts/causal_corner.py", file=sys.stderr)
        return 2
    print(f"python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, "
          f"device cpu, float64")
    rng = np.random.default_rng(0)
    H, d = 2, 4
    paths = torch_paths(torch)
    verdicts = {name: set() for name in paths}
    for T, S in SHAPES:
        q = rng.standard_normal((H, T, d))  # [H, T, d]
        k, v = rng.standard_normal((2, H, S, d))  # [H, S, d] each
        offset, top_left = causal_mask(T, S), np.tril(np.ones((T, S), bool))
        print(f"\nT={T} queries over S={S} keys")
        print(f"  {'kvlesson.causal_mask (offset)':32s} {' '.join(grid(offset))}")
        print(f"  {'np.tril(np.ones((T, S)))':32s} {' '.join(grid(top_left))}")
        for name, path in paths.items():
            seen, out = recovered_mask(torch, path, q, k, v)
            corner = [label for label, m in (("offset", offset), ("top-left", top_left)) if np.array_equal(seen, m)]
            matches = " and ".join(corner) if corner else "neither"
            if corner:  # the same outputs as kvlesson's attention under that mask, not only the same pattern
                ours = attention(q, k, v, mask=offset if corner[0] == "offset" else top_left)
                matches += f" (outputs equal kvlesson.attention with it: {np.abs(out - ours).max() < TOL})"
            verdicts[name].add(" and ".join(corner) or "neither")
            print(f"  {'torch ' + name:32s} {' '.join(grid(seen))}   = {matches}")
    print("\nover all shapes where T < S:")
    for name in paths:
        print(f"  torch {name:20s} applies the {' / '.join(sorted(verdicts[name] - {'offset and top-left'}))} mask")
    return 0


if __name__ == "__main__":
    sys.exit(main())
