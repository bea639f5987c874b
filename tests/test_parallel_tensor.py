"""Tensor parallelism: the shards are views that add up to the model, and SmolLM2 on 3 and 9 ranks equals one process.

The launches load the real model (the `model` fixture makes sure it is in the cache, and marks them). Tolerances:
the ranks' all-reduces add the heads' partial sums in another order than one process's products do, so the logits
agree within kvlesson.costs.tolerance.CHUNK_TOL (measured: about 1e-4), and greedy text token for token. The mutant
leaves out the feed-forward's all-reduce on every rank.
"""
import textwrap

import numpy as np
import pytest

from kvlesson import model as kvmodel
from kvlesson.costs.tolerance import CHUNK_TOL
from kvlesson.parallel import launch, tensor


def test_three_ranks_hold_one_kv_head_each_and_nine_share_them_three_by_three():
    cfg = kvmodel.tiny_config(H=9, Hkv=3, D=36, d=4, hidden=40)
    assert [list(tensor.heads(cfg, r, 3)[1]) for r in range(3)] == [[0], [1], [2]]
    assert [list(tensor.heads(cfg, r, 9)[1]) for r in range(9)] == [[0]] * 3 + [[1]] * 3 + [[2]] * 3
    assert [list(tensor.heads(cfg, r, 1)[1]) for r in range(1)] == [[0, 1, 2]]
    cfg8 = kvmodel.tiny_config(H=64, Hkv=8, D=64, d=1, hidden=8)  # Llama 3.1 70B's heads at TP 16: two ranks a head
    assert [tensor.heads(cfg8, r, 16)[1] for r in range(16)] == [range(r // 2, r // 2 + 1) for r in range(16)]


@pytest.mark.parametrize("P, words", [(2, "P must divide H=9"), (4, "P must divide H=9"),
                                      (0, "P must be at least 1")])
def test_a_P_that_does_not_share_the_heads_is_refused_by_name(P, words):
    with pytest.raises(ValueError, match=words):
        tensor.check(kvmodel.tiny_config(H=9, Hkv=3, D=36, d=4), P)
    with pytest.raises(ValueError, match="P must divide Hkv=4 or be a multiple"):
        tensor.check(kvmodel.tiny_config(H=12, Hkv=4, D=48, d=4), 3)


@pytest.mark.parametrize("P", [1, 3, 9])
def test_the_shards_are_views_whose_products_sum_to_the_model(P):
    """Without MPI: run every rank's shard in one process and add their partials where the all-reduce would; one
    process's logits come back to float64 rounding, and no shard copies a weight. The mutant check: leaving out any
    reduce fails it (test_a_reduce_left_out_in_lockstep_is_caught)."""
    cfg = kvmodel.tiny_config(H=9, Hkv=3, D=36, d=4, hidden=40, n_layers=2, vocab=50)
    w = kvmodel.random_weights(cfg, seed=1, dtype=np.float64)
    ids = [3, 1, 4, 1, 5]
    want = kvmodel.forward(cfg, w, ids, kvmodel.new_cache(cfg, np.float64))
    shards = [tensor.shard(cfg, w, r, P) for r in range(P)]
    for _, mine in shards:
        assert all(np.shares_memory(mine[n], w[n]) for n in mine)
    got = lockstep(cfg, shards, ids)
    np.testing.assert_allclose(got, want, atol=1e-12)
    hidden = sum(local.hidden for local, _ in shards)
    assert hidden == cfg.hidden and sorted(c for r in range(P) for c in tensor.columns(40, r, P)) == list(range(40))


def lockstep(cfg, shards, ids, skip=None):
    """Every rank's forward pass in one process, a thread a rank: each reduce waits for all ranks' partials -> the
    logits, every rank's slice of the vocabulary side by side."""
    import threading

    P = len(shards)
    partials, barrier, out = [None] * P, threading.Barrier(P), [None] * P

    def rank(r):
        local, mine = shards[r]

        calls = [0]

        def reduce(partial):
            calls[0] += 1
            if calls[0] == skip:  # the mutant: this one all-reduce left out, on every rank
                return partial
            partials[r] = partial
            barrier.wait()
            full = sum(partials)  # rank order, the same on every rank
            barrier.wait()
            return full
        out[r] = kvmodel.forward(local, mine, ids, kvmodel.new_cache(local, np.float64), reduce=reduce)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(P)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(o is not None for o in out)
    return np.concatenate(out, axis=-1)  # each rank scored its slice of the vocabulary


def test_a_reduce_left_out_in_lockstep_is_caught():
    cfg = kvmodel.tiny_config(H=9, Hkv=3, D=36, d=4, hidden=40, n_layers=2, vocab=50)
    w = kvmodel.random_weights(cfg, seed=1, dtype=np.float64)
    want = kvmodel.forward(cfg, w, [3, 1, 4], kvmodel.new_cache(cfg, np.float64))
    got = lockstep(cfg, [tensor.shard(cfg, w, r, 3) for r in range(3)], [3, 1, 4], skip=3)
    assert np.abs(got - want).max() > 1e-3


def test_fused_weights_are_refused():
    cfg = kvmodel.tiny_config(H=9, Hkv=3, D=36, d=4)
    with pytest.raises(ValueError, match="plain weights"):
        tensor.shard(cfg, {"blk.0.attn_qkv.weight": None}, 0, 3)


def prompt(model):
    return model.tokenizer.encode(model.chat_prompt("What is the capital of France?"))


def test_three_ranks_write_what_one_process_writes(model):
    ids = prompt(model)
    run = launch.mpiexec(3, "tensor", "--ids", ",".join(map(str, ids)), "--new-tokens", 16)
    assert run.result["tokens"] == model.generate(ids, 16)
    assert np.abs(run.result["logits"] - model.forward(ids)).max() < CHUNK_TOL
    ranks = run.result["ranks"]
    assert [r["kv_heads"] for r in ranks] == [[0], [1], [2]]
    D, layers = model.config.D, model.config.n_layers
    calls = 2 * layers * 16  # two all-reduces a layer, one prefill and 15 decode steps
    assert ranks[1]["ledger"]["Allreduce"] == (calls, 2 * layers * (len(ids) + 15) * D * 4)


def test_nine_ranks_copy_each_kv_head_three_times_and_agree(model):
    ids = prompt(model)[:12]
    run = launch.mpiexec(9, "tensor", "--ids", ",".join(map(str, ids)), "--new-tokens", 1)
    assert np.abs(run.result["logits"] - model.forward(ids)).max() < CHUNK_TOL
    per_rank = {r["cache_bytes"] for r in run.result["ranks"]}
    one_head = 2 * model.config.n_layers * 1 * model.config.d * 4 * 13  # K and V, one KV head, 13 positions
    assert per_rank == {one_head}


def test_an_all_reduce_left_out_is_caught(model, tmp_path):
    mutant = tmp_path / "no_mlp_reduce.py"
    mutant.write_text(textwrap.dedent("""
        from kvlesson.parallel import launch, tensor

        real = tensor.all_reduce

        def every_other(comm):  # the mutant: the feed-forward's all-reduce left out, the attention's kept
            reduce, calls = real(comm), [0]
            def maybe(partial):
                calls[0] += 1
                return reduce(partial) if calls[0] % 2 else partial
            return maybe

        tensor.all_reduce = every_other
        launch.main(tensor.program, tensor.arguments())
    """))
    ids = prompt(model)[:12]
    run = launch.launch(3, [str(mutant), "--ids", ",".join(map(str, ids)), "--new-tokens", 1])
    assert np.abs(run.result["logits"] - model.forward(ids)).max() > 1


def test_two_ranks_for_nine_heads_are_refused_by_the_ranks_themselves(model):
    with pytest.raises(ValueError, match=r"rank \d of 2: ValueError: P=2 ranks cannot share 9 query heads"):
        launch.mpiexec(2, "tensor", "--ids", "1,2,3", "--new-tokens", 1, timeout=60)
