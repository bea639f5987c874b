"""How accurate is PyTorch's bfloat16 attention? `python scripts/bf16_attention_torch.py` (lesson 10, section 2)

Lesson 10 measures attention against float64 for recipes computed in numpy: bfloat16 everywhere, bfloat16 inputs with
float32 sums, the same with P rounded to bfloat16 before P.V (FlashAttention-2). No lesson may import torch, so the
rows for PyTorch's own bfloat16 attention are measured here, on the lesson's setting: one decode query per head,
H = 2 heads sharing one KV head, d = 64, over the first S of 32,768 random keys, the relative error of the output
vector against float64 (the largest over the heads). Two PyTorch paths, all tensors bfloat16 on the CPU:

  - by hand:  torch.softmax(q @ k^T / sqrt(d), dim=-1) @ v
  - SDPA:     torch.nn.functional.scaled_dot_product_attention(q, k, v)

Both return bfloat16, so their error includes rounding the output itself (about 2^-9 of each number); numpy's
"bfloat16 in, float32 sums" is printed with and without that last rounding, to compare like with like. It also
prints what torch's bfloat16 .sum() gives for 32,768 terms of 2^-15 (the lesson's stalled running sum), and for
256 + 1 + 1 + 1, which tells a float32 total from a bfloat16 one.

Needs torch, which kvlesson itself does not: run it with the reference install
(pip install -r requirements.txt -r requirements-reference.txt in a separate venv).
"""
import platform
import sys

import numpy as np

from kvlesson.shrink.precision import attention_in, bfloat16

CONTEXTS = [2**n for n in range(8, 16)]  # 256 .. 32,768 keys
H, D, SEED = 2, 64, 0


def relative_error(out, exact):
    """out, exact [H, 1, d] -> the largest relative error of an output vector over the heads."""
    out, exact = np.asarray(out, np.float64), np.asarray(exact, np.float64)
    return float((np.linalg.norm(out - exact, axis=-1) / np.linalg.norm(exact, axis=-1)).max())


def torch_rows(torch, q, K, V):
    """name -> fn(S) -> out [H, 1, d] as float64, for each PyTorch path in bfloat16."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    tq = torch.from_numpy(q).to(torch.bfloat16)  # [H, 1, d]
    tk = torch.from_numpy(K).to(torch.bfloat16).expand(H, -1, -1)  # [H, S_max, d]: both heads read KV head 0
    tv = torch.from_numpy(V).to(torch.bfloat16).expand(H, -1, -1)

    def by_hand(S):
        w = torch.softmax(tq @ tk[:, :S].transpose(1, 2) / D**0.5, dim=-1)
        return (w @ tv[:, :S]).double().numpy()

    def fused(S):
        return sdpa(tq[None], tk[None, :, :S], tv[None, :, :S])[0].double().numpy()

    return {"PyTorch bf16, softmax(q k^T) v by hand": by_hand, "PyTorch bf16, scaled_dot_product_attention": fused}


def main():
    try:
        import torch
    except ImportError:
        print("bf16_attention_torch needs torch: pip install -r requirements-reference.txt (a separate venv)",
              file=sys.stderr)
        return 2
    rng = np.random.default_rng(SEED)
    q = rng.standard_normal((H, 1, D))  # [H, T=1, d]
    K, V = rng.standard_normal((2, 1, CONTEXTS[-1], D))  # [Hkv=1, S, d]
    print(f"torch {torch.__version__}, numpy {np.__version__}, {platform.machine()}, "
          f"{torch.get_num_threads()} threads; H={H}, d={D}, seed {SEED}")
    rows = {name: [] for name in ["numpy: bfloat16 in, float32 sums", "numpy: the same, output rounded to bf16",
                                  "numpy: bfloat16 in, float32 sums, P in bf16 (FlashAttention-2), output in bf16"]}
    paths = torch_rows(torch, q, K[0], V[0])
    rows.update({name: [] for name in paths})
    for S in CONTEXTS:
        k, v = K[:, :S], V[:, :S]
        exact = attention_in(q, k, v, store=np.float64, accumulate=np.float64)[2]
        ours = attention_in(q, k, v, store=bfloat16, accumulate=np.float32)[2]
        fa2 = attention_in(q, k, v, store=bfloat16, accumulate=np.float32, p_store=bfloat16)[2]
        errors = [ours, ours.astype(bfloat16), fa2.astype(bfloat16), *(fn(S) for fn in paths.values())]
        for name, out in zip(rows, errors, strict=True):
            rows[name].append(relative_error(out, exact))
    print(f"\n{'output: relative error against float64':80} " + " ".join(f"{S:>7}" for S in CONTEXTS))
    for name, errs in rows.items():
        print(f"{name:80} " + " ".join(f"{e:7.4f}" for e in errs))
    terms = torch.full((32_768,), 2.0**-15, dtype=torch.bfloat16)
    print(f"\ntorch bf16 .sum() of 32,768 terms of 2^-15: {terms.sum().item()} (exact: 1)")
    probe = torch.tensor([256.0, 1, 1, 1], dtype=torch.bfloat16).sum().item()
    print(f"torch bf16 .sum() of 256, 1, 1, 1: {probe} (a float32 total, 259, rounded once gives 260; a bfloat16 "
          "total gives 256 in a loop, 258 in pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
