"""SHRP with the embedding objective: the same pipeline, distilling sentence embeddings instead of a task.

:class:`~surgery.strategies.shrp.ShrpPipeline` hands unlabelled :class:`~surgery.embedding.TextData`
to :func:`run_embedding_shrp`. The steps are SHRP's own: ``expert-attention`` on the target layers,
progressive training with :class:`~surgery.strategies.shrp.ProgressiveConversion` (balance loss
while converting), usage analysis, ``top1-prune``. What changes:

* the loss is the embedding objective against the model before surgery (the teacher), through
  :class:`ShrpEmbeddingTrainer` (SHRP's trainer over the embedding trainer, by inheritance);
* routers read the masked mean of the tokens by default (:data:`EMBEDDING_ROUTER_INPUT`), since a
  mean-pooled model never trained its [CLS] state to summarise the sentence. This default is
  reasoned, not yet measured: ``experiments/embeddings/bench_embed.py --variants shrp-3-mean shrp-3-cls`` measures
  it, and its run here did not finish (docs/embeddings.md). An explicit ``router_input`` wins;
* usage for Top-1 is counted on training texts, so the held-out texts stay unseen by every choice
  and only report: mean cosine and recall@10 against the teacher right after conversion (before any
  training), after the MoE stage and after the cut;
* the Expander's LayerNorm starts at γ = :data:`EMBEDDING_EXPANDER_GAIN` instead of the paper's 1,
  so the experts' update does not swamp the layer input (measured; see the constant). An explicit
  ``expander_gain`` wins.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any

from torch import nn

from surgery.anatomy import adapter_for
from surgery.embedding.evaluate import TeacherCache, evaluate_embeddings
from surgery.embedding.objective import (
    EmbeddingDistillTrainer,
    embedding_trainer,
    sentence_config_of,
)
from surgery.embedding.texts import require_text_data
from surgery.orchestration.pipeline import PipelineSession
from surgery.strategies.shrp.expert_attention import ExpertAttentionStrategy, RouterInput, expert_layers
from surgery.strategies.shrp.shrp_training import (
    ProgressiveConversion,
    ShrpTrainer,
    ShrpTrainingState,
    prepare_progressive,
    shrp_training_arguments,
)
from surgery.strategies.shrp.top1_prune import Top1PruningStrategy
from surgery.training import scratch_dir

if TYPE_CHECKING:
    from surgery.strategies.shrp.shrp import ShrpPipeline

# Router input of the embedding objective unless the config names one (reasoned; see the module docstring).
EMBEDDING_ROUTER_INPUT: RouterInput = "mean"
# Initial γ of the Expander's LayerNorm unless the config names one. At the paper's 1 the experts'
# unit-variance update swamps the layer input (std 0.6 in MiniLM-L6, whose layers change it by 0.3):
# 3 converted layers of MiniLM-L6 start at mean cosine 0.04 to the teacher, and a few hundred steps of
# embedding distillation cannot shrink γ back (Adam moves it ~lr per step). At 0.1 they start at 0.37.
EMBEDDING_EXPANDER_GAIN = 0.1
CALIBRATION_BATCHES = 16  # training batches whose routing decides Top-1 (held-out texts stay unseen)
EVAL_TEXTS = 2000  # held-out texts of the in-pipeline report (recall@10 needs a corpus this size)


def shrp_embedding_trainer_class() -> type[EmbeddingDistillTrainer]:
    """SHRP's trainer (balance loss, usage counts) over the embedding trainer (the loss), by inheritance."""
    class ShrpEmbeddingTrainer(ShrpTrainer, EmbeddingDistillTrainer):  # type: ignore[misc]
        """ShrpTrainer.compute_loss adds the balance loss to EmbeddingDistillTrainer.compute_loss."""

    return ShrpEmbeddingTrainer


def router_input_for(strategy: ShrpPipeline) -> RouterInput:
    """The config's ``router_input`` if the user set it, else the embedding objective's default."""
    cfg = strategy.config
    return cfg.router_input if "router_input" in cfg.model_fields_set else EMBEDDING_ROUTER_INPUT


def expander_gain_for(strategy: ShrpPipeline) -> float:
    """The config's ``expander_gain`` if the user set it, else the embedding objective's default."""
    cfg = strategy.config
    return cfg.expander_gain if "expander_gain" in cfg.model_fields_set else EMBEDDING_EXPANDER_GAIN


def run_embedding_shrp(strategy: ShrpPipeline, model: nn.Module, data: Any, session: PipelineSession) -> None:
    """Run SHRP on ``model`` with the embedding objective; figures go to ``session.metrics``."""
    text = require_text_data(data, strategy.name)
    cfg = strategy.config
    sentence = sentence_config_of(text)
    adapter = adapter_for(model)
    order = strategy.conversion_order(adapter.num_layers)
    teacher = copy.deepcopy(model).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    held_out = text.eval_texts[:EVAL_TEXTS]
    cache = TeacherCache(teacher, text.tokenizer, sentence, max_length=text.info.get("max_length"))
    router = router_input_for(strategy)
    gain = expander_gain_for(strategy)
    start = time.perf_counter()
    session.metrics.update(objective="embedding", pooling=sentence.describe(), router_input=router,
                            expander_gain=gain, layers=order, data=dict(text.info, split_seed=text.split_seed))

    def report() -> dict[str, Any]:
        k = min(10, len(held_out) - 1)
        return evaluate_embeddings(model, cache, text.tokenizer, held_out, sentence, k=k,
                                   max_length=text.info.get("max_length")).model_dump(mode="json")

    originals = {i: adapter.layers()[i] for i in order}
    session.step(ExpertAttentionStrategy(
        layers=order, router_input=router, router_grad=cfg.router_grad, top_k=cfg.top_k,
        expander=cfg.expander, expander_init=cfg.expander_init, expander_gain=gain, seed=cfg.seed))
    # Every layer converted, before any training: where distillation starts from.
    session.metrics["embedding_converted"] = report()
    for _, layer in expert_layers(model):
        layer.usage.zero_()
    layers = prepare_progressive(model, originals)
    state = ShrpTrainingState()
    epochs = cfg.finetune_epochs + len(order) + cfg.extra_epochs
    callback = ProgressiveConversion(layers, order, state, balance_weight=cfg.balance_weight,
                                     delay=cfg.finetune_epochs, reinit=cfg.reinit_on_activate, eval_loader=None,
                                     emit=session.emit, total_epochs=epochs)
    with scratch_dir("shrp-embed-") as tmp:
        trainer = embedding_trainer(model, teacher, text, shrp_training_arguments(cfg, epochs, tmp),
                                    trainer_class=shrp_embedding_trainer_class(), callbacks=[callback],
                                    shrp_state=state)
        trainer.train()
    model.eval()
    session.metrics["history"] = state.history
    session.metrics["train_seconds"] = time.perf_counter() - start

    for _, layer in expert_layers(model):
        layer.usage.zero_()
    session.metrics["embedding_moe"] = report()
    calibration = text.loader("train", batch_size=cfg.batch_size)
    prune = session.step(Top1PruningStrategy(keep=cfg.keep, max_batches=CALIBRATION_BATCHES), data=calibration)
    session.metrics["usage"] = prune.metrics.get("usage")
    session.metrics["embedding_pruned"] = report()
    if cfg.bench:
        from surgery.measure.bench import bench_models

        bench = bench_models({"input": teacher, "shrp": model}, batch_size=cfg.bench_batch_size,
                             seq_len=cfg.bench_seq_len, repeats=cfg.bench_repeats, warmup=1)
        session.metrics["bench"] = bench.model_dump(mode="json")
