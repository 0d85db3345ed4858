"""The Hugging Face adapter: per family, a tiny random config's blocks give the logits of the
transformers model itself (its own masks and rotary embeddings); one family trains on the
pipeline exactly as in one process."""
from __future__ import annotations

import pytest
import torch

from octopipe.model.hf import FAMILIES, build, hf_config
from octopipe.model.sharing import tied_tensors
from octopipe.model.user_module import UserBlocks, check_blocks
from octopipe.train.loop import reference_train
from octopipe.train.optim import OptimSettings
from octopipe.train.summary import compare
from tests.train.helpers import batches, named_plan, train, weight_floor

transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed; "
                                                          "pip install 'octopipe[hf]'")


@pytest.mark.parametrize("family", FAMILIES)
def test_blocks_give_the_transformers_models_logits(family):
    torch.manual_seed(0)
    blocks = build(family)
    torch.manual_seed(0)
    lm = transformers.AutoModelForCausalLM.from_config(hf_config(family))
    ids = torch.randint(0, 256, (2, 12))
    h = ids
    with torch.no_grad():
        for b in blocks:
            h = b(h)
        want = lm(ids).logits
    assert len(blocks) == lm.config.num_hidden_layers + 2
    assert torch.allclose(h, want, rtol=1e-5, atol=1e-6)


def test_a_qwen3_config_trains_on_the_pipeline_as_in_one_process():
    blocks = check_blocks(UserBlocks("octopipe.model.hf:build", 16, 2, 256, (("config", "qwen3"),)))
    data = batches(16, 2)
    optim = OptimSettings(lr=1e-2, warmup_steps=2, total_steps=6)
    ref = reference_train(blocks, data, 4, optim, 6)
    run = train(blocks, named_plan("zbv", blocks.n_blocks), data, steps=6, optim=optim)
    assert max(compare(run, ref, blocks, {})) <= 1e-5 and run.losses[-1] < run.losses[0]


def test_tie_word_embeddings_is_one_parameter_on_the_pipeline():
    """A config with tie_word_embeddings (the small Qwen and Llama 3.2 models): the head's matrix
    is the embedding's, trained as one parameter across the two end stages."""
    blocks = check_blocks(UserBlocks("octopipe.model.hf:build", 16, 2, 256,
                                     (("config", "qwen2"), ("tie_word_embeddings", True))))
    ties = tied_tensors(blocks.raw(0)[0])
    assert [(t.name, t.blocks) for t in ties if t.parameter] == [("0.embed.weight", (0, 3))]
    data = batches(16, 2)
    optim = OptimSettings(lr=1e-2, warmup_steps=2, total_steps=6)
    ref = reference_train(blocks, data, 4, optim, 6)
    run = train(blocks, named_plan("1f1b", blocks.n_blocks), data, steps=6, optim=optim)
    loss_err, weight_err = compare(run, ref, blocks, {})
    assert loss_err <= 1e-5 and run.tied_equal is True
    # the tie sums two stages' gradients in another order than autograd: rounding, which AdamW
    # magnifies in the attention key's bias (its true gradient is zero)
    assert weight_err <= max(1e-5, 8 * weight_floor(blocks, data, ref, optim, 6)), weight_err
