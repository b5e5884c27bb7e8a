"""What several test modules share: a tiny tokenizer and data files, a sentence-transformers directory,
self-labelled task data and shape-based latency tables. Test modules import these from here, never
from one another (fixtures shared the same way live in conftest.py).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch
from torch import nn
from transformers import BertTokenizer
from typer.testing import CliRunner

import surgery
from surgery.compress.latency_source import TableLatency
from surgery.compress.shape_table import shape_latency_table
from surgery.data.task_data import TaskData
from surgery.strategies import ExpertAttentionStrategy, FFNPruningStrategy, HeadPruningStrategy, SoftPromptStrategy
from surgery.testing import FAMILIES, VOCAB, TinySpec, tiny_model
from surgery.training import PaddingCollator

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
#: The tiny tokenizer's words: w0 ... w93, one id each after the specials, 99 ids in all (the tiny models' vocabulary).
WORDS = [f"w{i}" for i in range(VOCAB - len(SPECIALS))]
#: 48 unlabelled sentences of the tiny vocabulary, for the embedding objective.
EMBEDDING_TEXTS = [" ".join(WORDS[(i * 7 + j * 13) % len(WORDS)] for j in range(2 + i % 7)) for i in range(48)]
runner = CliRunner(env={"COLUMNS": "200"})  # wide tables, so assertions do not depend on wrapping
ROOT = Path(__file__).resolve().parent.parent


def tiny_tokenizer() -> BertTokenizer:
    """A word-level BERT tokenizer whose vocabulary matches the tiny models' 99 ids."""
    return BertTokenizer(vocab={token: i for i, token in enumerate(SPECIALS + WORDS)})


def write_rows(path: Path, rows: list[dict[str, object]]) -> Path:
    """``rows`` as a CSV file with a header."""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def labelled_rows(n: int, text: str = "text", label: str = "label", seed: int = 0) -> list[dict[str, object]]:
    """Separable two-class data: "pos" texts use the first half of the vocabulary, "neg" the second."""
    rng = random.Random(seed)
    half = len(WORDS) // 2
    rows = []
    for i in range(n):
        positive = i % 2 == 0
        pool = WORDS[:half] if positive else WORDS[half:]
        rows.append({text: " ".join(rng.choices(pool, k=rng.randint(3, 9))), label: "pos" if positive else "neg"})
    return rows


def st_dir(root: Path, pooling: dict[str, object], normalize: bool, model: torch.nn.Module | None = None) -> Path:
    """A complete sentence-transformers directory around a tiny BERT."""
    (model or tiny_model(TinySpec("bert"))).save_pretrained(root)
    tiny_tokenizer().save_pretrained(root)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pooling}))
    (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16, "do_lower_case": False}))
    return root


def saved_classifier(root: Path, *, layers: int = 2, labels: tuple[str, ...] = ("neg", "pos")) -> nn.Module:
    """A tiny BERT classifier whose head names ``labels`` (id order), saved with the tiny tokenizer into ``root``.

    Data labels are read through the head's ``id2label``: a classifier used with ``labelled_rows``
    (``pos``/``neg``) must name them.
    """
    model = tiny_model(TinySpec("bert", task="seq-cls", layers=layers), num_labels=len(labels),
                       id2label=dict(enumerate(labels)), label2id={name: i for i, name in enumerate(labels)})
    model.save_pretrained(root)
    tiny_tokenizer().save_pretrained(root)
    return model


def self_labelled(model: nn.Module, n: int = 30) -> TaskData:
    """Task data labelled by ``model`` itself (its accuracy is 100%), 3 labels; ``rarest`` is its least used label."""
    gen = torch.Generator().manual_seed(0)
    ids = [[2, *torch.randint(5, 99, (int(k),), generator=gen).tolist(), 3]
           for k in torch.randint(2, 8, (n,), generator=gen)]
    with torch.no_grad():
        labels = model(**PaddingCollator(None)([{"input_ids": r} for r in ids])).logits.argmax(-1).tolist()
    table = datasets.Dataset.from_dict({"input_ids": ids, "labels": labels})
    task = TaskData(table, table, ["a", "b", "c"], batch_size=10)
    task.rarest = min(range(3), key=labels.count)  # type: ignore[attr-defined]
    return task


def tables_for(model: torch.nn.Module) -> TableLatency:
    """Latency from shape tables: torch, ORT and OpenVINO fp32 alike; int8 at 40% of their time."""
    return TableLatency({"torch": shape_latency_table(model), "onnxruntime": shape_latency_table(model, "onnxruntime"),
                         "onnxruntime-int8": shape_latency_table(model, "onnxruntime-int8", scale=0.4),
                         "openvino": shape_latency_table(model, "openvino")})


def few_latency_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured latency tables of few probes (heads none or all, the FFN whole or empty) timed in short units: for
    tests of what a table is keyed, cached, counted or exported on, not of its grid (each probe is an export)."""
    from surgery.compress import latency_measure

    monkeypatch.setattr(latency_measure, "HEAD_FRACTIONS", (0.0, 1.0))
    monkeypatch.setattr(latency_measure, "WIDTH_FRACTIONS", (1.0,))
    monkeypatch.setattr(latency_measure, "MIN_TIMED_SECONDS", 0.002)


def module_fingerprint(module: nn.Module, inputs: dict[str, torch.Tensor], *extra: object) -> str:
    """A digest of everything an ONNX trace of ``module(**inputs)`` depends on here: its classes and structure (its
    repr), its config (the attention implementation included), every weight and buffer byte for byte, and the
    inputs' names, shapes and dtypes (the graph's axes are dynamic; the values are not traced)."""
    config = getattr(getattr(module, "model", module), "config", None)
    digest = hashlib.sha256(repr(module).encode())
    digest.update(repr((str(config), getattr(config, "_attn_implementation", None), getattr(module, "output", None),
                        getattr(module, "inputs", None))).encode())
    for name, tensor in module.state_dict(keep_vars=False).items():
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    digest.update(repr([(k, tuple(v.shape), v.dtype) for k, v in inputs.items()]).encode())
    digest.update(repr(extra).encode())
    return digest.hexdigest()


def identical_graphs_traced_once(monkeypatch: pytest.MonkeyPatch, traced: dict[str, bytes] | None = None
                                 ) -> list[str]:
    """In this test, a module identical to one already traced to ONNX (``module_fingerprint``: the same structure,
    config, weights and input shapes) is not traced again: its graph is the first trace's bytes, which a second
    trace of the same module writes anyway. The module still runs once under the same context, so that the fused
    attention recorder sees each layer's heads as the trace would; the parity checks, quantization, sessions and
    records of every export are made as usual. For tests of what is done with exported graphs (a cache key, a count
    of timings) that export the same latency probes twice. ``traced`` (fingerprint -> graph bytes), when given, is
    shared: a module-scoped dict lets the tests of one module that export the same modules trace each once. Returns
    the fingerprints this test served from an earlier trace."""
    from surgery.runtimes.onnx import onnx_graph

    real = onnx_graph._torch_export
    traced = {} if traced is None else traced
    reused: list[str] = []

    def once(module: nn.Module, inputs: dict[str, torch.Tensor], path: Path, *, opset: int | None,
             max_seq: int | None) -> None:
        key = module_fingerprint(module, inputs, opset, max_seq)
        if key in traced:
            with torch.no_grad():
                module(**inputs)
            path.write_bytes(traced[key])
            reused.append(key)
            return
        real(module, inputs, path, opset=opset, max_seq=max_seq)
        traced[key] = path.read_bytes()

    monkeypatch.setattr(onnx_graph, "_torch_export", once)
    return reused


def main_path_only(monkeypatch: pytest.MonkeyPatch, *, steps: int | None = None, precision: bool = False) -> None:
    """A search along the main path alone (its first ``steps`` points with ``steps``): no units or uniform path
    beside it, no layer-drop candidate, and no int8 precision pass after it unless ``precision``. For tests of what
    is done with judged candidates (handed back, saved, exported once) or of the precision pass, not of the paths
    searched: tests/test_compress.py tests the three paths'.

    Example: ``main_path_only(monkeypatch)`` before ``surgery.compress(model, data, CompressConfig(speedup=3))``."""
    from surgery.compress.candidate_run import CandidateRun
    from surgery.compress.plan import CompressPlan

    def families(plan: CompressPlan) -> dict[str, object]:
        cut = plan.path if steps is None else plan.path.model_copy(update={"steps": plan.path.steps[:steps]})
        return {"path": cut}

    monkeypatch.setattr(CompressPlan, "families", families)
    monkeypatch.setattr(CandidateRun, "layer_drop_want", lambda self, speedup: None)
    if not precision:
        monkeypatch.setattr(CandidateRun, "precision", lambda *_a, **_k: None)


def judge_two(monkeypatch: pytest.MonkeyPatch) -> None:
    """A --max-drop search that judges two candidates on each runtime: the unchanged model and the main path's first
    cut (its only point here; ``main_path_only``).

    Example: ``judge_two(monkeypatch)`` before ``surgery.compress(model, data, CompressConfig(max_drop=50, ...))``."""
    main_path_only(monkeypatch, steps=1)


#: The uneven model's heads removed per layer: 1, 4 and 3 of 4 heads left.
UNEVEN_HEADS = {0: [0, 2, 3], 2: [1]}
#: Its FFN neurons removed per layer: widths 9, 0 (every neuron of layer 1) and 11 of 12.
UNEVEN_NEURONS = {0: [0, 3, 5], 1: list(range(12)), 2: [7]}


def uneven_model(family: str, *, routed: bool = True) -> tuple[nn.Module, TinySpec]:
    """A 3-layer tiny model of ``family`` carrying what exports must handle: uneven heads (1, 4, 3), uneven FFN
    widths with an empty FFN (9, 0, 11), and with ``routed`` layer 1 as a routed Expert Attention layer (its
    data-dependent expert gather) and a 3-token soft prompt. A classifier for every other family.

    The models of ``conftest.UnevenExports``: one export per family and runtime serves every test that reads it.
    """
    index = FAMILIES.index(family)
    spec = TinySpec(family, heads=4, head_dim=4, layers=3, ffn=12, task="seq-cls" if index % 2 else "base",
                    seed=index)
    model = tiny_model(spec)
    surgery.convert(model, HeadPruningStrategy(heads=UNEVEN_HEADS))
    surgery.convert(model, FFNPruningStrategy(neurons=UNEVEN_NEURONS))
    if routed:
        surgery.convert(model, ExpertAttentionStrategy(layers=[1]))
        surgery.convert(model, SoftPromptStrategy(length=3))
    return model, spec


def run_cli(args: list[str], cwd: Path) -> tuple[int, str, list[str]]:
    """Run the CLI in a new interpreter; its exit code, stderr and which heavy modules it had imported by then."""
    probe = ("import sys\nfrom surgery.cli import main\nsys.argv = ['surgery'] + sys.argv[1:]\ntry:\n    main()\n"
             "except SystemExit as exc:\n    code = exc.code\nelse:\n    code = 0\n"
             "print('IMPORTED', [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules])\n"
             "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", probe, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    imported = json.loads(done.stdout.strip().splitlines()[-1].removeprefix("IMPORTED ").replace("'", '"'))
    return done.returncode, done.stderr, imported


#: Runs CLI cases one after another in one new interpreter, as ``surgery`` would (``surgery.cli.main``), each with its
#: own exit code, stdout and stderr. The streams are the file descriptors 1 and 2, not ``sys.stdout``/``sys.stderr``
#: alone, so that what a library prints from C lands in the case's stream as it would in a process of its own.
CLI_BATCH = """
import json, os, sys, tempfile, traceback
from surgery.cli import main
results = []
for args in json.loads(sys.argv[1]):
    streams = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    sys.stdout.flush(), sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    os.dup2(streams[0].fileno(), 1), os.dup2(streams[1].fileno(), 2)
    sys.argv = ["surgery", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        os.close(saved[0]), os.close(saved[1])
    texts = []
    for stream in streams:
        stream.seek(0)
        texts.append(stream.read().decode(errors="replace"))
    results.append([code, *texts, [m for m in ("torch", "transformers", "datasets") if m in sys.modules]])
print("RESULTS", json.dumps(results))
"""


def start_cli_batch(cases: list[list[str]], **popen: object) -> subprocess.Popen[str]:
    """Start one interpreter that runs ``cases`` (CLI argument lists) in turn: a single torch import for all of them,
    where a process per case imports it once each. Read its results with ``cli_batch_results``.

    Example: ``cli_batch_results(start_cli_batch([["inspect", model_dir], ["bench", model_dir]]))``."""
    return subprocess.Popen([sys.executable, "-c", CLI_BATCH, json.dumps(cases)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)  # type: ignore[call-overload]


#: How long a test waits for one real ``surgery`` process before calling it hung. A guard against hangs, not a
#: time the process should take: a fresh-clone suite at nice 19 beside a nice -5 benchmark (load 5-10) saw a tiny
#: OpenVINO export take over 300 s and a batch of CLI runs over 600 s (2026-11-26).
HANG_SECONDS = 1200


def cli_batch_results(run: subprocess.Popen[str], timeout: float = 2 * HANG_SECONDS
                      ) -> list[tuple[int, str, str, list[str]]]:
    """Each case's exit code, stdout, stderr and the heavy modules (torch, transformers, datasets) imported by its end,
    in the order given to ``start_cli_batch``."""
    stdout, stderr = run.communicate(timeout=timeout)
    lines = [line for line in stdout.splitlines() if line.startswith("RESULTS ")]
    assert run.returncode == 0 and lines, f"the batch itself failed (exit {run.returncode}): {stderr[-3000:]}"
    return [tuple(result) for result in json.loads(lines[-1].removeprefix("RESULTS "))]  # type: ignore[misc]


def one_family_fast(first: str = "bert") -> list[Any]:
    """FAMILIES to parametrize a test over, every family but ``first`` in the slow lane: the fast lane checks one
    family and the whole suite all of them (for tests that cost a second or more per family).

    Example:
        >>> [getattr(p, "values", (p,))[0] for p in one_family_fast()] == list(FAMILIES)
        True
    """
    return [f if f == first else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES]
