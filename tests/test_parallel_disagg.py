"""Disaggregated prefill and decode on two ranks: the decode rank's tokens equal model.generate's, and a block table
shipped without its last, partly filled block is caught (here by the receiver's own check, which names it)."""
import textwrap

import pytest

from kvlesson.parallel import launch


def prompt(model):
    return model.tokenizer.encode(model.chat_prompt("What is the capital of France?"))


@pytest.mark.parametrize("block_size", [16, 37])  # 37 positions: a partly filled last block, then none at all
def test_the_decode_rank_writes_what_one_process_writes(model, block_size):
    ids = prompt(model)
    assert len(ids) == 37
    run = launch.mpiexec(2, "disagg", "--ids", ",".join(map(str, ids)), "--new-tokens", 8, "--block-size", block_size)
    assert run.result["tokens"] == model.generate(ids, 8)
    blocks = -(-len(ids) // block_size)
    per_position = 2 * model.config.n_layers * model.config.Hkv * model.config.d * 4  # K and V, float32
    assert run.result["block_bytes"] == blocks * block_size * per_position
    assert run.result["ledger"]["Send"] == (3, run.result["block_bytes"] + 8 * (3 + blocks))  # header, table


def test_a_block_table_without_its_last_partial_block_is_caught(model, tmp_path):
    mutant = tmp_path / "short_table.py"
    mutant.write_text(textwrap.dedent("""
        from kvlesson.parallel import disagg, launch

        # the mutant: whole blocks only, the partly filled last one left behind
        disagg.blocks_to_ship = lambda pool, seq: disagg.np.array(
            pool.block_table(seq)[: pool.length(seq) // pool.block_size], disagg.np.int64)
        launch.main(disagg.program, disagg.arguments())
    """))
    ids = prompt(model)
    with pytest.raises(ValueError, match=r"the block table holds 2 blocks of 16 positions for a sequence of 37"):
        launch.launch(2, [str(mutant), "--ids", ",".join(map(str, ids)), "--new-tokens", 8])


def test_disaggregation_needs_two_ranks():
    with pytest.raises(ValueError, match="runs on 2 ranks"):
        launch.mpiexec(3, "disagg", "--ids", "1,2,3", timeout=60)
