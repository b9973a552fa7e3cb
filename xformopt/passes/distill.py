"""distill: knowledge distillation, so a pruned or shallower student learns back from the original.

The teacher is the original model (the recipe's input, ``--teacher DIR``, or the model named in the
input's ``manifest.json``); the student is the input stage -- e.g. the output of ``prune`` -- or,
when distill is the first torch pass, a copy of the teacher with layers dropped (``student_layers``,
evenly spaced from the first to the last; or ``keep_layers``). See ``xformopt.distill.student``.

Losses (``xformopt.distill.losses``): classification ``alpha * T^2 * KL(teacher || student at
temperature T) + (1 - alpha) * cross-entropy(labels)`` (KL alone on unlabelled data); feature
extraction ``mse_weight * MSE + cosine_weight * (1 - cosine)`` between the mean-pooled embeddings
(no labels needed: any text works); optional ``hidden_weight`` x hidden-state MSE and
``attention_weight`` x head-averaged attention-map MSE through a layer map (student layer i ->
teacher layer ``layer_map[i]``, 1-based hidden-state index).

Data: ``train_data`` through the shared loader (labelled or not; default the vendored train split),
tokenized once; rows whose text is also in the held-out set the run reports on, or in the
evaluation set used for early stopping, are dropped. Evaluation/early stopping: ``eval_data``
(default the vendored validation split), or a held-out part of ``train_data``. The teacher's outputs
are computed once and kept in memory (see ``xformopt.distill.data`` for the bounds).

Training (``xformopt.distill.train``): AdamW, warm-up + linear decay, ``epochs``/``max_steps`` and a
``max_minutes`` budget (the whole pass, teacher pass included), held-out evaluation every
``eval_every`` steps with early stopping and best-checkpoint selection, resumable checkpoints
(``xformopt.distill.checkpoint``), seeded; CPU with ``ctx.threads`` threads, CUDA when present
(``device``).

Output: a stock Hugging Face directory (reloaded and checked against the in-memory student before
the pass returns), ``distill_curve.png`` (training curve), and the record: losses and weights,
steps, epochs, seconds, why it stopped, every evaluation, the best step, the student's shape.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from xformopt import progress
from xformopt.artifact import copy_side_files, hash_dir
from xformopt.data import load_text_dataset
from xformopt.distill import checkpoint as ckpt
from xformopt.distill import data as D
from xformopt.distill import losses as L
from xformopt.distill import qat as Q
from xformopt.distill import student as S
from xformopt.distill import train as T
from xformopt.distill.augment import augmented
from xformopt.distill.curve import plot_training_curve
from xformopt.distill.data import collate, forward
from xformopt.distill.relations import relation_heads
from xformopt.errors import InputError, PassFailed
from xformopt.models import load_tokenizer, load_torch_model
from xformopt.passes.base import Pass, PassContext, PassOptions
from xformopt.passes.records import DistillRecord
from xformopt.passes.surgery import arch_for, current_shape, weights_sha256
from xformopt.resources import vader_split_path

CURVE = "distill_curve.png"
# Options that do not change what is learned: left out of the checkpoint identity, so a rerun with
# another budget or checkpoint cadence still resumes.
NOT_IN_IDENTITY = ("max_minutes", "checkpoint_dir", "checkpoint_every", "resume", "device", "log_every_seconds")


class DistillOptions(PassOptions):
    teacher: str | None = Field(None, description="teacher model directory; default: the run's input model "
                                                  "(single command: the model named in the input's manifest.json)")
    student_layers: int | None = Field(None, ge=1, description="keep this many student layers (evenly spaced); "
                                                               "default: all of a given student, half when cut from the teacher")
    keep_layers: list[int] | None = Field(None, min_length=1, description="explicit student layers to keep (0-based)")
    temperature: float = Field(2.0, gt=0, description="softmax temperature of the soft-target KL")
    alpha: float = Field(0.5, ge=0, le=1, description="weight of the soft-target KL; 1 - alpha on the hard labels")
    mse_weight: float = Field(1.0, ge=0, description="feature extraction: weight of the embedding MSE")
    cosine_weight: float = Field(1.0, ge=0, description="feature extraction: weight of 1 - cosine")
    hidden_weight: float = Field(0.0, ge=0, description="weight of the hidden-state MSE through the layer map")
    attention_weight: float = Field(0.0, ge=0, description="weight of the head-averaged attention-map MSE")
    relation_weight: float = Field(0.0, ge=0, description="weight of MiniLM's query/key/value relation KL between "
                                                          "the last student layer and its mapped teacher layer")
    unlabeled_data: str | None = Field(None, description="more texts for the teacher to label (soft targets only): "
                                                         "a .txt file (one per line) or any data file's text column")
    augment: int = Field(0, ge=0, le=16, description="without unlabeled_data: teacher-labelled augmented copies "
                                                     "of each training text (xformopt/distill/augment.py)")
    layer_map: list[int] | None = Field(None, description="teacher hidden-state index (1-based) per student layer; "
                                                          "default: the layers the student came from")
    train_data: str | None = Field(None, description="training texts (labels optional); default: vendored train split")
    eval_data: str | None = Field(None, description="held-out texts for evaluation and early stopping; default: "
                                                    "vendored validation split (or part of train_data)")
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = Field(None, description="'' trains on texts only (KL to the teacher, no labels)")
    train_samples: int | None = Field(None, ge=1, description="train on at most this many rows (seeded)")
    eval_samples: int | None = Field(None, ge=8, description="evaluate on at most this many rows (seeded)")
    batch_size: int = Field(32, ge=1)
    max_length: int = Field(128, ge=8, description="truncate inputs to this many tokens")
    lr: float = Field(1e-4, gt=0, description="peak learning rate (AdamW)")
    weight_decay: float = Field(0.01, ge=0)
    warmup: float = Field(0.06, ge=0, lt=1, description="fraction of the planned steps spent warming up")
    epochs: float = Field(3.0, gt=0, description="passes over the training rows")
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimizer steps")
    max_minutes: float | None = Field(None, gt=0, description="time budget for the whole pass (teacher pass included)")
    eval_every: int | None = Field(None, ge=1, description="steps between held-out evaluations; default: twice per epoch")
    patience: int = Field(4, ge=0, description="stop after this many evaluations without improvement (0: never)")
    min_delta: float = Field(0.0, ge=0, description="smallest improvement of the selection metric that counts")
    stop_at: float | None = Field(None, description="stop once the selection metric reaches this value")
    select: Literal["auto", "accuracy", "agreement", "cosine", "kl_to_teacher"] = Field(
        "auto", description="metric for early stopping and the best checkpoint; auto: accuracy (labels), "
                            "agreement (no labels), cosine (embeddings)")
    keep: Literal["best", "last"] = Field(
        "best", description="the student saved: the best evaluation's weights, or the last step's (the evaluation "
                            "rows then choose nothing, so they stay an unbiased estimate of the student)")
    grad_clip: float = Field(1.0, ge=0, description="max gradient norm (0: no clipping)")
    freeze_embeddings: bool = Field(False, description="do not train the word embeddings (faster steps)")
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when present, else CPU")
    teacher_cache_mb: int = Field(1024, ge=0, description="memory for cached teacher hidden states (float16); "
                                                          "above it the teacher runs beside the student")
    checkpoint_dir: str | None = Field(None, description="where resumable checkpoints go; default: under the xformopt cache")
    checkpoint_every: int = Field(200, ge=0, description="steps between checkpoints (0: only on Ctrl-C)")
    resume: bool = Field(True, description="continue from a checkpoint of the same run when one exists")
    log_every_seconds: float = Field(30.0, gt=0, description="progress line interval when stderr is not a terminal")
    qat: bool = Field(False, description="quantization-aware training in the last qat_epochs: the student's Linear "
                                         "layers see the target's dynamic INT8 (xformopt/distill/qat.py)")
    qat_epochs: float = Field(1.0, gt=0, description="epochs of the quantization-aware phase (after the others)")
    qat_lr: float | None = Field(None, gt=0, description="peak learning rate of the QAT phase; default: lr / 2")
    qat_per_channel: bool | None = Field(None, description="QAT weight scales per channel; default: the target's")
    qat_reduce_range: bool | None = Field(None, description="QAT 7-bit weights; default: the target's")

    @model_validator(mode="after")
    def _exclusive(self):
        if self.student_layers is not None and self.keep_layers is not None:
            raise ValueError("student_layers and keep_layers are exclusive; give one")
        return self


# --------------------------------------------------------------------------- data


def load_sets(ctx: PassContext, options: DistillOptions, labelled: bool):
    """(training rows, evaluation rows, notes): see the module docstring for defaults and disjointness."""
    label_column = options.label_column if labelled else ""
    kwargs = dict(text_column=options.text_column, text_pair_column=options.text_pair_column,
                  label_column=label_column, label2id=(ctx.spec.label2id or None) if labelled else None)
    notes = {}
    if options.train_data:
        train = load_text_dataset(Path(options.train_data), **kwargs)
    else:
        train = load_text_dataset(vader_split_path("train"), **{**kwargs, "text_column": None, "text_pair_column": ""})
    if options.eval_data:
        heldout = load_text_dataset(Path(options.eval_data), **kwargs, limit=options.eval_samples, seed=options.seed)
    elif options.train_data:
        if len(train) < 16:
            raise InputError(f"{options.train_data} has {len(train)} rows; distillation needs at least 16 "
                             "(training + held-out evaluation), or pass eval_data")
        want = options.eval_samples or min(1000, max(8, len(train) // 5))
        heldout, train = train.split(min(0.5, want / len(train)), options.seed)
    else:
        heldout = load_text_dataset(vader_split_path("validation"), **{**kwargs, "text_column": None, "text_pair_column": ""},
                                    limit=options.eval_samples, seed=options.seed)
    reported = set(ctx.heldout_texts)
    keep_eval = [i for i, t in enumerate(heldout.texts) if t not in reported]
    notes["eval_rows_dropped_as_in_reported_heldout"] = len(heldout) - len(keep_eval)
    if not keep_eval:
        raise InputError("every evaluation row is also in the held-out set the run reports on; pass eval_data "
                         "with other rows")
    heldout = heldout.subset(keep_eval) if len(keep_eval) < len(heldout) else heldout
    excluded = reported | set(heldout.texts)
    keep = [i for i, t in enumerate(train.texts) if t not in excluded]
    notes["train_rows_dropped_as_in_heldout_or_eval"] = len(train) - len(keep)
    if not keep:
        raise InputError(f"no training rows left: all {len(train)} rows of {train.source} are also in the held-out "
                         "or evaluation rows; pass train_data with other texts")
    if options.train_samples and options.train_samples < len(keep):
        keep = sorted(np.random.default_rng(options.seed).permutation(keep)[: options.train_samples].tolist())
    train = train.subset(keep) if len(keep) < len(train) else train
    if labelled and options.select == "accuracy" and heldout.labels is None:
        raise InputError("select: accuracy needs labels in the evaluation rows; pass eval_data with labels "
                         "or select: agreement")
    return train, heldout, notes


# --------------------------------------------------------------------------- the pass


def _texts_digest(*datasets) -> str:
    h = hashlib.sha256()
    for ds in datasets:
        for i, t in enumerate(ds.texts):
            h.update(t.encode())
            h.update(b"\x1f")
            if ds.text_pairs:
                h.update(ds.text_pairs[i].encode())
            if ds.labels is not None:
                h.update(str(ds.labels[i]).encode())
            h.update(b"\x1e")
        h.update(b"\x1d")
    return h.hexdigest()


def _load(spec, path: Path, eager: bool):
    model = load_torch_model(spec, path)
    if eager:  # attention maps are only returned by the eager implementation
        model.set_attn_implementation("eager")
    return model


class DistillPass(Pass):
    name = "distill"
    stage = "torch"
    depends_on = ("texts", "reported", "timing")  # the reported rows are kept out of its training data
    consumes = "hf"
    produces = "hf"
    Options = DistillOptions
    Record = DistillRecord
    summary = "knowledge distillation: the student (pruned or layer-dropped) learns from the original model"
    needs = ("training texts, labels optional (default: vendored train split)",
             "evaluation rows for early stopping (default: vendored validation split)",
             "the teacher (the run's input model, or --teacher)")
    flags = {"train_data": "train_data", "validation_data": "eval_data", "unlabeled_data": "unlabeled_data"}
    data_options = ("train_data", "eval_data", "unlabeled_data")
    minutes_option = "max_minutes"
    labelled_fallbacks = {"train_data": ("train", "distill's training rows"),
                          "eval_data": ("validation", "distill's evaluation rows")}

    @classmethod
    def reads(cls, option: str, options: dict) -> bool:
        if option == "eval_data":  # with train_data and no eval_data, evaluation rows are split from train_data
            return bool(options.get("eval_data")) or not options.get("train_data")
        return True

    @staticmethod
    def summarize(rec: dict) -> str:
        """Student shape, how long and why it stopped, the held-out metric before -> after (teacher)."""
        st, tr, q = rec["student"], rec["training"], rec["quality"]
        metric = rec["selection"]["metric"]
        teacher = q["teacher"].get(metric)
        line = (f"student {st['layers']} layers, heads {st['heads_per_layer']}, FFN {st['ffn_per_layer'][0]} "
                f"({st['params']:,} params); {tr['steps']} steps, {tr['epochs']} epochs in "
                f"{tr['seconds']['total_with_teacher_pass'] / 60:.1f} min (stopped: {tr['stopped_because']}); "
                f"held-out {metric} {q['before'].get(metric, float('nan')):.4f} -> {q['after'].get(metric, float('nan')):.4f}"
                f"{f' (teacher {teacher:.4f})' if teacher is not None and metric != 'cosine' else ''}, "
                f"best at step {rec['selection']['best_step']}"
                + ("; kept the last step's weights" if rec["selection"].get("keep") == "last" else ""))
        if rec.get("qat"):
            qat = rec["qat"]
            line += (f"; QAT {qat['steps']} steps: held-out {metric} under INT8 {qat['ptq_on_eval_rows'].get(metric, float('nan')):.4f} "
                     f"(post-training) -> {qat['qat_on_eval_rows'].get(metric, float('nan')):.4f} (QAT)")
        if rec.get("curve"):
            line += f"; curve {rec['curve']}"
        return line

    def run(self, ctx: PassContext, src: Path, dst: Path, options: DistillOptions) -> DistillRecord:
        import torch

        started = T.CLOCK()
        wall_start = time.perf_counter()
        objective = ctx.spec.task_def.torch_objective
        labelled = objective == "logits"
        arch = arch_for(ctx.spec.model_type)
        src = Path(src)
        choice = S.resolve_teacher(src, ctx.spec.path, options.teacher)
        teacher_cfg = json.loads((choice.path / "config.json").read_text())
        student_cfg = json.loads((src / "config.json").read_text())
        if teacher_cfg.get("model_type") != student_cfg.get("model_type"):
            raise InputError(f"teacher {choice.path} is a {teacher_cfg.get('model_type')!r} model and the student "
                             f"{src} a {student_cfg.get('model_type')!r} one; distill within one architecture family")
        student_tok = load_tokenizer(src, ctx.spec.trust_remote_code)
        try:
            teacher_tok = load_tokenizer(choice.path, ctx.spec.trust_remote_code)
        except Exception:  # noqa: BLE001 - no (fast) tokenizer files: the vocabulary size is still compared
            teacher_tok = None
        # hidden states go through a projection when the widths differ; attention maps and relations are L x L
        S.check_compatible(objective, teacher_cfg, student_cfg, teacher_tok, student_tok, choice.path, src,
                           need_same_hidden=False)
        offered = arch.layout.distill_terms
        for term, weight in (("hidden_mse", options.hidden_weight), ("attention_mse", options.attention_weight),
                             ("relation_kl", options.relation_weight)):
            if weight > 0 and term not in offered:
                raise InputError(f"{term} is not offered for {ctx.spec.model_type} (its family row offers "
                                 f"{', '.join(offered) or 'none'}); set {term.split('_')[0]}_weight to 0")
        weights = L.weights_for(objective, True, alpha=options.alpha, mse_weight=options.mse_weight,
                                cosine_weight=options.cosine_weight, hidden_weight=options.hidden_weight,
                                attention_weight=options.attention_weight, relation_weight=options.relation_weight)
        if not weights:
            raise InputError("every loss weight is 0: nothing to train on; raise alpha, mse_weight or cosine_weight")
        if options.select == "cosine" and labelled or options.select in ("accuracy", "agreement", "kl_to_teacher") \
                and not labelled:
            raise InputError(f"select: {options.select} does not apply to {objective}; use auto")

        train_set, heldout_set, notes = load_sets(ctx, options, labelled)
        has_labels = labelled and train_set.labels is not None
        weights = L.weights_for(objective, has_labels, alpha=options.alpha, mse_weight=options.mse_weight,
                                cosine_weight=options.cosine_weight, hidden_weight=options.hidden_weight,
                                attention_weight=options.attention_weight, relation_weight=options.relation_weight)
        extra_texts, notes["extra_texts"] = extra_training_texts(options, train_set)
        ctx.log(f"distill: teacher {choice.path} ({choice.how}); {len(train_set)} training rows "
                f"({'labelled' if has_labels else 'no labels'}), {len(heldout_set)} evaluation rows")

        previous_threads = torch.get_num_threads()
        torch.set_num_threads(max(1, ctx.threads))
        try:
            return self._train(ctx, src, dst, options, choice, train_set, heldout_set, notes, weights, has_labels,
                               student_tok, arch, started, wall_start, hash_dir, ckpt, D, S, T, current_shape,
                               extra_texts)
        finally:
            torch.set_num_threads(previous_threads)

    def _train(self, ctx, src, dst, options, choice, train_set, heldout_set, notes, weights, has_labels, tokenizer,
               arch, started, wall_start, hash_dir, ckpt, D, S, T, current_shape, extra_texts=()) -> dict:
        import torch

        objective = ctx.spec.task_def.torch_objective
        torch.manual_seed(options.seed)
        device = torch.device("cuda" if options.device == "cuda" or (options.device == "auto" and torch.cuda.is_available())
                              else "cpu")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise InputError("device: cuda asked for, but no CUDA device is available; use device: auto or cpu")
        eager = options.attention_weight > 0
        teacher = _load(ctx.spec, choice.path, eager)
        teacher.requires_grad_(False)
        teacher_layers = len(arch.layers(teacher))
        if choice.student_from_teacher:
            student = copy.deepcopy(teacher)
            origins = list(range(teacher_layers))
            source = "cut from the teacher (layers dropped)"
            keep = S.choose_layers(teacher_layers, options.student_layers, options.keep_layers, default_half=True)
            if keep is None or len(keep) == teacher_layers:
                raise InputError(f"the student would keep all {teacher_layers} layers of the teacher: nothing to distill "
                                 "into; give student_layers below that, or a pruned student (run prune first)")
        else:
            student = _load(ctx.spec, src, eager)
            origins = S.prune_origins(src)
            source = "the input stage" + (" (pruned; layer origins from its prune record)" if origins else "")
            n = len(arch.layers(student))
            if origins is None or len(origins) != n:
                origins = list(range(n)) if n == teacher_layers else None
            keep = S.choose_layers(n, options.student_layers, options.keep_layers, default_half=False)
        if keep is not None:
            S.drop_layers(student, arch, keep)
            origins = [origins[i] for i in keep] if origins is not None else None
        student.requires_grad_(True)
        if options.freeze_embeddings:
            student.get_input_embeddings().weight.requires_grad_(False)
        n_student = len(arch.layers(student))
        if options.layer_map is not None:
            bad = [j for j in options.layer_map if not 0 <= j <= teacher_layers]
            if len(options.layer_map) != n_student or bad:
                raise InputError(f"layer_map {options.layer_map}: give one teacher layer (1..{teacher_layers}; 0 = "
                                 f"embeddings) for each of the student's {n_student} layers")
            layer_map = list(options.layer_map)
        else:
            layer_map = S.default_layer_map(origins, n_student, teacher_layers)
        if (options.attention_weight > 0 or options.relation_weight > 0) and 0 in layer_map:
            raise InputError("layer_map index 0 (the embeddings) has no attention map; map every student layer to a "
                             "teacher layer 1.. for attention transfer")
        teacher.to(device)
        student.to(device)

        accepts = set(inspect.signature(student.forward).parameters)
        train_enc = D.encode(tokenizer, train_set.texts, train_set.text_pairs,
                             train_set.labels if has_labels else None, options.max_length)
        if extra_texts:  # teacher-labelled rows: soft targets only (label -100, skipped by the cross-entropy)
            extra = D.encode(tokenizer, extra_texts, None, None, options.max_length)
            train_enc.ids += extra.ids
            if train_enc.types is not None:
                train_enc.types += extra.types or [np.zeros_like(i) for i in extra.ids]
            if train_enc.labels is not None:
                train_enc.labels = np.concatenate([train_enc.labels, np.full(len(extra), -100, dtype=np.int64)])
        heldout_enc = D.encode(tokenizer, heldout_set.texts, heldout_set.text_pairs,
                               heldout_set.labels if objective == "logits" else None, options.max_length)

        need_hidden = options.hidden_weight > 0
        hidden_size = arch.hidden(teacher.config)
        cache_mb = D.hidden_cache_mb(train_enc.lengths, hidden_size, len(set(layer_map))) if need_hidden else 0.0
        relations = None
        if options.relation_weight > 0:  # the last student layer against its mapped teacher layer (MiniLM)
            s_width = arch.heads(arch.layers(student)[-1]) * arch.head_dim(arch.layers(student)[-1])
            t_last = arch.layers(teacher)[layer_map[-1] - 1]
            relations = (n_student - 1, layer_map[-1] - 1,
                         relation_heads(s_width, arch.heads(t_last) * arch.head_dim(t_last), arch.head_dim(t_last)), arch)
        if need_hidden:
            s_hidden, t_hidden = arch.hidden(student.config), arch.hidden(teacher.config)
            if s_hidden != t_hidden:
                student.distill_projection = torch.nn.Linear(s_hidden, t_hidden).to(device)
        online = options.attention_weight > 0 or relations is not None or (need_hidden and cache_mb > options.teacher_cache_mb)
        cached_layers = sorted(set(layer_map)) if need_hidden and not online else []
        student_hash = hash_dir(src)
        teacher_hash = student_hash if choice.student_from_teacher else hash_dir(choice.path)
        disk_key = hashlib.sha256(json.dumps([teacher_hash, objective, D.ids_digest(train_enc, heldout_enc)]).encode())
        disk_path = ckpt.home() / "distill-teacher" / f"{disk_key.hexdigest()[:24]}.safetensors"
        on_disk = None if cached_layers or online else D.load_cached_main(disk_path)
        if on_disk and on_disk[0] is not None and len(on_disk[0]) == len(train_enc) and len(on_disk[1]) == len(heldout_enc):
            ctx.log(f"distill: teacher outputs reused from {disk_path}")
            cache = D.TeacherCache(on_disk[0], [], None, None, 0.0)
            heldout_teacher, from_disk = on_disk[1], True
        else:
            ctx.log(f"distill: teacher pass over {len(train_enc)} training rows" + (
                f" (caching {len(cached_layers)} hidden layers, {cache_mb:.0f} MB float16)" if cached_layers else ""))
            cache = D.teacher_outputs(teacher, train_enc, objective, accepts, cached_layers, 64, device,
                                      progress=progress.tracker("distill: teacher pass (batches)"))
            if cached_layers:  # the cache is indexed by position in cached_layers
                position = {j: p for p, j in enumerate(cached_layers)}
                cache.hidden = [cache.hidden[position[j]] for j in layer_map]
            heldout_teacher = D.teacher_outputs(teacher, heldout_enc, objective, accepts, [], 64, device).main
            from_disk = False
            try:
                D.save_cached_main(disk_path, cache.main, heldout_teacher)
            except OSError as exc:  # a read-only cache only costs the next run the teacher pass
                ctx.log(f"distill: teacher outputs not kept on disk ({exc})")
        teacher_for_training = teacher if online else None
        if not online:
            del teacher  # its outputs are all in the cache now

        budget = options.max_minutes * 60 if options.max_minutes else None
        if budget and options.qat:  # the QAT phase's share of the budget is kept for it
            budget_first = budget * (1 - Q.budget_share(options.epochs, options.qat_epochs))
        else:
            budget_first = budget
        settings = T.Settings(
            objective=objective, weights=weights, temperature=options.temperature, layer_map=layer_map, lr=options.lr,
            weight_decay=options.weight_decay, warmup=options.warmup, epochs=options.epochs,
            max_steps=options.max_steps, max_seconds=budget_first,
            batch_size=options.batch_size, eval_every=options.eval_every, patience=options.patience,
            min_delta=options.min_delta, stop_at=options.stop_at, select=options.select, keep=options.keep,
            grad_clip=options.grad_clip,
            checkpoint_every=options.checkpoint_every, seed=options.seed, log_every_seconds=options.log_every_seconds,
            relations=relations)
        identity = hashlib.sha256(json.dumps({
            "student": student_hash, "teacher": teacher_hash if not choice.student_from_teacher else "input",
            "objective": objective, "data": _texts_digest(train_set, heldout_set),
            "options": {k: v for k, v in options.model_dump().items() if k not in NOT_IN_IDENTITY},
        }, sort_keys=True, default=str).encode()).hexdigest()
        root = Path(options.checkpoint_dir) if options.checkpoint_dir else ckpt.default_root(identity)
        trainer_kwargs = dict(student=student, teacher=teacher_for_training, settings=settings, train=train_enc,
                              heldout=heldout_enc, cache=cache, heldout_teacher=heldout_teacher, accepts=accepts,
                              device=device, log=ctx.log, started=started, checkpoint_root=root, identity=identity,
                              resume=options.resume, online_teacher=online)
        result = T.Trainer(**trainer_kwargs).run()
        qat_record = None
        if options.qat:
            quant = ctx.target.quant
            qat_record = Q.run_phase(
                trainer_cls=T.Trainer, trainer_kwargs=trainer_kwargs, settings=settings, qat_epochs=options.qat_epochs,
                lr=options.qat_lr or options.lr / 2,
                per_channel=quant.per_channel if options.qat_per_channel is None else options.qat_per_channel,
                reduce_range=quant.reduce_range if options.qat_reduce_range is None else options.qat_reduce_range,
                max_seconds=budget, log=ctx.log)

        projected = hasattr(student, "distill_projection")
        if projected:  # a training aid, not part of the student
            del student.distill_projection
        student.to("cpu").eval()
        student.save_pretrained(dst)
        copy_side_files(src, dst)
        reload = self._reload_check(ctx, student, dst, heldout_enc, accepts)
        ckpt.remove(root)

        teacher_metrics = self._teacher_metrics(objective, heldout_teacher, heldout_enc)
        shape = current_shape(student, arch)
        params = int(sum(p.numel() for p in student.parameters()))
        record = {
            "teacher": {"path": str(choice.path), "how": choice.how, "layers": teacher_layers,
                        "metrics_on_eval_rows": teacher_metrics},
            "student": {"source": source, "layers": shape.num_layers, "heads_per_layer": shape.heads,
                        "ffn_per_layer": shape.ffn, "hidden": shape.hidden, "params": params,
                        "origins": origins, "dropped_here": keep is not None},
            "losses": {
                "weights": weights, "temperature": options.temperature, "layer_map": layer_map if (
                    options.hidden_weight or options.attention_weight or options.relation_weight) else None,
                "hidden_projection": projected, "relation_layers": [relations[0], relations[1]] if relations else None,
                "relation_heads": relations[2] if relations else None,
                "family_terms": list(arch.layout.distill_terms),
                "definitions": LOSS_DEFINITIONS[objective],
            },
            "data": {
                "train": {"source": train_set.source, "rows": len(train_set), "labelled": has_labels},
                "eval": {"source": heldout_set.source, "rows": len(heldout_set),
                         "labelled": heldout_enc.labels is not None},
                **notes, "max_length": options.max_length, "batch_size": options.batch_size,
                "teacher_outputs": {"mode": "online" if online else "cached", "seconds": round(cache.seconds, 2),
                                    "reused_from_disk": from_disk,
                                    "hidden_cache_mb": round(cache_mb, 1) if cached_layers else 0.0},
            },
            "training": {
                "steps": result.steps, "epochs": result.epochs, "stopped_because": result.stopped_because,
                "lr": options.lr, "warmup": options.warmup, "schedule": "linear warm-up, then linear decay to 0 at the horizon",
                "horizon": result.horizon, "seconds": result.seconds, "device": str(device),
                "threads": torch.get_num_threads(), "seed": options.seed,
                "resumed_from_step": result.resumed_from_step, "resumed_from_steps": result.extra["resumed_from_steps"],
                "checkpoints_written": result.checkpoints_written,
                "checkpoint_dir": str(root), "eval_every": result.extra["eval_every"],
                "max_minutes": options.max_minutes,
            },
            "evaluations": result.history,
            "selection": {"metric": result.extra["metric"], "best_step": result.best_step, "keep": options.keep,
                          "kept_step": result.kept_step},
            "quality": {"teacher": teacher_metrics, "before": _metrics_only(result.before),
                        "after": _metrics_only(result.kept), "eval_rows": len(heldout_set)},
            "qat": qat_record,
            "reload_check": reload,
            "weights_sha256": weights_sha256(student),
            "pass_seconds": round(time.perf_counter() - wall_start, 2),
        }
        try:
            plot_training_curve(record, dst / CURVE, title=f"{ctx.spec.source}: distill")
            record["curve"] = CURVE
        except Exception as exc:  # noqa: BLE001 - a plot is never worth the run
            ctx.log(f"{CURVE} not written: {type(exc).__name__}: {exc}")
            record["curve"] = None
        return record

    @staticmethod
    def _teacher_metrics(objective, heldout_teacher, heldout_enc) -> dict:
        if objective != "logits":
            return {"cosine": 1.0}
        out = {"agreement": 1.0}
        if heldout_enc.labels is not None:
            pred = heldout_teacher.argmax(-1).numpy()
            out = {"accuracy": round(float((pred == heldout_enc.labels).mean()), 6), **out}
        return out

    @staticmethod
    def _reload_check(ctx, student, dst: Path, heldout_enc, accepts) -> dict:
        """The saved folder loads (models.load_torch_model) and computes what the trained student computes."""
        import torch

        idx = list(range(min(16, len(heldout_enc))))
        enc = collate(heldout_enc, idx, accepts)
        reloaded = load_torch_model(ctx.spec, dst)
        with torch.inference_mode():
            a = forward(student, enc, ctx.spec.task_def.torch_objective)[0]
            b = forward(reloaded, enc, ctx.spec.task_def.torch_objective)[0]
        diff = float((a - b).abs().max())
        if not diff <= 1e-4:
            raise PassFailed(f"the saved student does not reproduce the trained one (max |diff| {diff:.2e}); "
                             "report this with XFORMOPT_DEBUG=1")
        return {"rows": len(idx), "max_abs_diff": diff}


def extra_training_texts(options: DistillOptions, train_set) -> tuple[list[str], dict]:
    """Texts for the teacher to label beside the training rows: unlabeled_data, else ``augment`` augmented
    copies of the training texts; rows also in the training set are not repeated."""
    if options.unlabeled_data:
        path = Path(options.unlabeled_data)
        if path.suffix.lower() == ".txt":  # one text per line
            texts = [t.strip() for t in path.read_text(encoding="utf-8", errors="replace").splitlines() if t.strip()]
        else:
            texts = load_text_dataset(path, text_column=options.text_column, label_column="").texts
        if not texts:
            raise InputError(f"unlabeled_data {path} has no texts")
        source = options.unlabeled_data
    elif options.augment:
        texts = augmented(train_set.texts, options.augment, options.seed)
        source = f"{options.augment} augmented cop{'y' if options.augment == 1 else 'ies'} of each training text"
    else:
        return [], None
    seen = set(train_set.texts)
    kept = list(dict.fromkeys(t for t in texts if t not in seen))
    return kept, {"source": source, "rows": len(kept), "labels": "the teacher's (soft targets only)"}


def _metrics_only(entry: dict) -> dict:
    keep = ("accuracy", "agreement", "kl_to_teacher", "cosine", "min_cosine", "mse")
    return {"step": entry["step"], **{k: entry[k] for k in keep if k in entry}}


LOSS_DEFINITIONS = {
    "logits": {
        "soft_kl": "T^2 * KL(softmax(teacher/T) || softmax(student/T)), summed over classes, mean over the batch",
        "hard_ce": "cross-entropy of the student's logits on the gold labels, mean over the batch",
        "hidden_mse": "MSE of student layer i vs teacher layer layer_map[i] token states over real tokens, mean over layers",
        "attention_mse": "MSE of head-averaged attention maps over real (query, key) pairs, mean over mapped layers",
        "relation_kl": "MiniLM: KL(teacher || student) of softmax(A A^T / sqrt(d_r)) for A in query, key, value of "
                       "the last student layer and its mapped teacher layer, R relation heads, over real positions",
        "total": "alpha * soft_kl + (1 - alpha) * hard_ce (soft_kl alone without labels) "
                 "+ hidden_weight * hidden_mse + attention_weight * attention_mse + relation_weight * relation_kl",
    },
    "embedding": {
        "embedding_mse": "mean over batch and dimensions of (student - teacher)^2, mean-pooled embeddings",
        "embedding_cosine": "mean over the batch of 1 - cos(student, teacher)",
        "hidden_mse": "MSE of student layer i vs teacher layer layer_map[i] token states over real tokens, mean over layers",
        "attention_mse": "MSE of head-averaged attention maps over real (query, key) pairs, mean over mapped layers",
        "total": "mse_weight * embedding_mse + cosine_weight * embedding_cosine "
                 "+ hidden_weight * hidden_mse + attention_weight * attention_mse",
    },
}
