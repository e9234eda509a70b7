"""response_logprobs' backward sums every gradient in a fixed order, so identical runs are bitwise identical under
any machine load (issue 28; docs/reliability.md#determinism). The runs themselves: tests/trainer/test_determinism.py."""

from __future__ import annotations

import torch

from support.logprobs import PROMPT_INDEX, padded_batch
from tokenpo.models.logprobs import response_logprobs


def backward_nodes(root) -> list:
    """Every node of the autograd graph below `root` (a grad_fn), each once."""
    seen, todo, nodes = set(), [root], []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return nodes


def repeated_index_gathers(logp: torch.Tensor) -> list[str]:
    """The indexing gathers (x[idx]) in logp's graph whose index repeats a position. Their backward is index_put_
    with accumulate, which on CPU adds with parallel atomics in an order that depends on thread timing."""
    found = []
    for node in backward_nodes(logp.grad_fn):
        if type(node).__name__ != "IndexBackward0":
            continue
        # x[rows, cols] gathers position (rows[i], cols[i]): a repeat is a repeated pair, not a repeated row
        given = [index for index in node._saved_indices if index is not None]
        indices = [index.flatten() for index in torch.broadcast_tensors(*given)]
        positions = torch.stack(indices, 1)
        if positions.unique(dim=0).shape[0] < positions.shape[0]:
            found.append(f"{tuple(node._saved_self_sym_sizes)} indexed by {[i.tolist() for i in indices]}")
    return found


def test_the_shared_prompt_gradient_sums_in_a_fixed_order(model):  # noqa: F811
    """Each prompt's KV cache and last hidden state serve its G responses: their G gradients are summed in row
    order (index_select), not by indexing with the repeated group ids, whose atomic adds made concurrently
    started identical runs differ from the first update on."""
    prompt_ids, prompt_mask, response_ids, response_mask = padded_batch()
    logp, _ = response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, prompt_index=PROMPT_INDEX)
    assert logp.requires_grad
    assert repeated_index_gathers(logp) == []
    index_selects = [n for n in backward_nodes(logp.grad_fn) if type(n).__name__ == "IndexSelectBackward0"]
    # per bucket: the prompt's last hidden state and each layer's keys and values (2 layers)
    assert index_selects and len(index_selects) % (1 + 2 * 2) == 0
