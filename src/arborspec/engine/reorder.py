"""Block-sparsity friendly node order for tree attention (Xiong et al. 2024, "DySpec", App. C).

Block-sparse attention kernels skip `block x block` tiles of the mask that are
all empty. The tree mask (node i attends to its ancestors and itself) has far
fewer non-empty tiles when every root-to-leaf path occupies consecutive rows,
which a DFS order achieves; visiting heavier subtrees first approximates the
heavy-path decomposition the paper cites. `SpeculativeDecoder(...,
reorder_dfs=True)` applies `tree.permuted(dfs_order(tree))` before verifying:
the verifiers only see children lists, so the output is unchanged.

Example (root 0 with children 1, 2; node 2 has child 3; subtree sizes 1 and 2):
`dfs_order` visits 0, 2, 3, 1.
"""

from __future__ import annotations

import torch

from .tree import TokenTree


def subtree_sizes(tree: TokenTree) -> list[int]:
    """Nodes in each node's subtree, itself included."""
    sizes = [1] * tree.num_nodes
    for i in range(tree.num_nodes - 1, 0, -1):  # parents precede children
        sizes[tree.parents[i]] += sizes[i]
    return sizes


def dfs_order(tree: TokenTree) -> list[int]:
    """Old node indices in DFS pre-order, children visited by descending subtree size (stable)."""
    sizes = subtree_sizes(tree)
    order, stack = [], [0]
    while stack:
        node = stack.pop()
        order.append(node)
        # heaviest first, ties in sibling order
        kids = sorted(tree.children[node], key=lambda c: -sizes[c])
        stack.extend(reversed(kids))
    return order


def mask_blocks(tree: TokenTree, block: int) -> int:
    """Number of `block x block` tiles of the `[N, N]` ancestor mask holding at least one True."""
    mask = tree.ancestors_mask()  # [N, N]
    n = mask.shape[0]
    pad = -n % block
    mask = torch.nn.functional.pad(mask, (0, pad, 0, pad))  # [M, M], M a multiple of block
    m = mask.shape[0] // block
    tiles = mask.view(m, block, m, block).any(dim=3).any(dim=1)  # [m, m]
    return int(tiles.sum())
