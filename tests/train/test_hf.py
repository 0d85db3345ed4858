"""The Hugging Face adapter: per family, a tiny random config's blocks give the logits of the
transformers model itself (its own masks and rotary embeddings); one family trains on the
pipeline exactly as in one process."""
from __future__ import annotations

import pytest
import torch

from octopipe.model.hf import FAMILIES, build, hf_config
from octopipe.model.user_module import UserBlocks, check_blocks
from octopipe.train.loop import reference_train
from octopipe.train.optim import OptimSettings
from octopipe.train.summary import compare
from tests.train.helpers import batches, named_plan, train

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
