"""The picture of a paged pool: which sequence's positions sit in which slot of which block.

`pool_layout` and `conflicts` are pure (tested); `draw_pool` paints them.
"""
import matplotlib.pyplot as plt
import numpy as np

NAMES = "abcdefghijklmnopqrstuvwxyz"
CONFLICT = "tab:red"


def pool_layout(pool):
    """-> {(block, slot): [(sequence, position), ...]}: every slot some sequence reads, and who reads it as what.

    A slot in a shared block appears once per sequence that uses it, with the same position for each.
    """
    cells = {}
    for seq in sorted(pool._tables):
        table, bs = pool.block_table(seq), pool.block_size
        for p in range(pool.length(seq)):
            cells.setdefault((table[p // bs], p % bs), []).append((seq, p))
    return cells


def conflicts(pool, expected):
    """-> set of (block, slot): the slots where some sequence reads a key it never wrote.

    expected: {sequence: keys [Hkv, S, d]}, what each sequence would hold alone (its own KVCache's keys). Sharing a
    slot is right when every reader expects the key it holds (a prefix written before a fork); a slot that two
    sequences each wrote after a fork holds only the last write, and the other reader expects something else.
    """
    bad = set()
    for (block, slot), readers in pool_layout(pool).items():
        held = pool.k[:, block, slot]  # [Hkv, d]
        if any(seq in expected and not np.array_equal(np.asarray(expected[seq])[:, p], held) for seq, p in readers):
            bad.add((block, slot))
    return bad


def draw_pool(pool, ax=None, title=None, expected=None):
    """The pool as a grid: one column per block, one row per slot. A slot shows the position it holds and the
    sequences (a, b, ...) that read it; shared slots are hatched; slots no sequence reads are blank. Given
    `expected` (see conflicts), a slot where some sequence reads a key it never wrote is drawn in red, marked "!"."""
    cells = pool_layout(pool)
    wrong = conflicts(pool, expected) if expected is not None else set()
    if ax is None:
        _, ax = plt.subplots(figsize=(0.55 * pool.n_blocks + 1.2, 0.45 * pool.block_size + 1.1))
    colours = plt.get_cmap("tab10")
    for (block, slot), readers in cells.items():
        seqs = [s for s, _ in readers]
        bad = (block, slot) in wrong
        face = CONFLICT if bad else colours(seqs[0] % 10)
        ax.add_patch(plt.Rectangle((block - 0.5, slot - 0.5), 1, 1, facecolor=face, alpha=0.8 if bad else 0.55,
                                   hatch="//" if len(seqs) > 1 else None, edgecolor="0.1" if bad else "0.3",
                                   lw=2 if bad else 0.5))
        label = "".join(NAMES[s % 26] for s in seqs) + str(readers[0][1]) + ("!" if bad else "")
        ax.text(block, slot, label, ha="center", va="center", fontsize=6.5, fontweight="bold" if bad else "normal")
    ax.set_xlim(-0.5, pool.n_blocks - 0.5)
    ax.set_ylim(pool.block_size - 0.5, -0.5)
    ax.set_xticks(range(pool.n_blocks))
    ax.set_yticks(range(pool.block_size))
    ax.set_xticks(np.arange(-0.5, pool.n_blocks), minor=True)
    ax.set_yticks(np.arange(-0.5, pool.block_size), minor=True)
    ax.grid(which="minor", color="0.6", lw=0.8)
    ax.tick_params(which="both", length=0, labelsize=7)
    ax.set_xlabel("physical block", fontsize=8)
    ax.set_ylabel("slot", fontsize=8)
    ax.set_title(title or f"{pool.n_blocks} blocks of {pool.block_size}; label = sequence(s) and position; "
                          f"{pool.blocks_free} free", fontsize=9)
    return ax
