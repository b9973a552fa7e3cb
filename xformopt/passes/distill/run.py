"""distill: knowledge distillation, so a pruned or shallower student learns back from the original.

The teacher is the original model (the recipe's input, ``--teacher DIR``, or the model named in the
input's ``manifest.json``); the student is the input stage -- e.g. the output of ``prune`` -- or,
when distill is the first torch pass, a copy of the teacher with layers dropped (``student_layers``,
evenly spaced from the first to the last; or ``keep_layers``). See ``xformopt.passes.distill.student``.
With ``student: NAME`` the student is a pretrained model of any family instead, with the teacher's head
(logit-level when its tokenizer differs): ``xformopt.passes.distill.pretrained``.

Losses (``xformopt.passes.distill.losses``): classification ``alpha * T^2 * KL(teacher || student at
temperature T) + (1 - alpha) * cross-entropy(labels)`` (KL alone on unlabelled data); feature
extraction ``mse_weight * MSE + cosine_weight * (1 - cosine)`` between the mean-pooled embeddings
(no labels needed: any text works); optional ``hidden_weight`` x hidden-state MSE and
``attention_weight`` x head-averaged attention-map MSE through a layer map (student layer i ->
teacher layer ``layer_map[i]``, 1-based hidden-state index).

Data: ``train_data`` through the shared loader (labelled or not; default the vendored train split),
tokenized once; rows whose text is also in the held-out set the run reports on, or in the
evaluation set used for early stopping, are dropped. Evaluation/early stopping: ``eval_data``
(default the vendored validation split), or a held-out part of ``train_data``. The teacher's outputs
are computed once and kept in memory (see ``xformopt.passes.distill.data`` for the bounds).

Training (``xformopt.passes.distill.train``): AdamW, warm-up + linear decay, ``epochs``/``max_steps`` and a
``max_minutes`` budget (the whole pass, teacher pass included; training alone with ``teacher_pass_in_budget:
false``), held-out evaluation every
``eval_every`` steps with early stopping and best-checkpoint selection, resumable checkpoints
(``xformopt.passes.distill.checkpoint``), seeded; CPU with ``ctx.threads`` threads, CUDA when present
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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from xformopt import progress
from xformopt.artifact import copy_side_files, hash_dir
from xformopt.cache_stores import store, touch
from xformopt.errors import InputError, PassFailed
from xformopt.models import load_tokenizer, load_torch_model
from xformopt.passes.base import Pass, PassContext
from xformopt.passes.distill import checkpoint as ckpt
from xformopt.passes.distill import data as D
from xformopt.passes.distill import losses as L
from xformopt.passes.distill import pretrained as P
from xformopt.passes.distill import qat as Q
from xformopt.passes.distill import student as S
from xformopt.passes.distill import train as T
from xformopt.passes.distill.curve import plot_training_curve
from xformopt.passes.distill.data import collate, forward
from xformopt.passes.distill.options import DistillOptions
from xformopt.passes.distill.record import LOSS_DEFINITIONS, metrics_only, teacher_metrics
from xformopt.passes.distill.relations import relation_heads
from xformopt.passes.distill.sets import extra_training_texts, load_sets, texts_digest
from xformopt.passes.records import DistillRecord
from xformopt.passes.surgery import arch_for, current_shape, weights_sha256

CURVE = "distill_curve.png"
# Options that do not change what is learned: left out of the checkpoint identity, so a rerun with
# another budget or checkpoint cadence still resumes.
NOT_IN_IDENTITY = ("max_minutes", "teacher_pass_in_budget", "checkpoint_dir", "checkpoint_every", "resume", "device", "log_every_seconds")


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
    student_option = "student"
    labelled_fallbacks = {"train_data": ("train", "distill's training rows"),
                          "eval_data": ("validation", "distill's evaluation rows")}

    @classmethod
    def reads(cls, option: str, options: dict) -> bool:
        if option == "eval_data":  # with train_data and no eval_data, evaluation rows are split from train_data
            return bool(options.get("eval_data")) or not options.get("train_data")
        return True

    @classmethod
    def check_own(cls, spec, options: dict) -> None:
        """A pretrained student is located and held to the teacher (tokenizer, terms, width) before any work."""
        if options.get("student"):
            teacher = Path(options.get("teacher") or spec.path)
            if (teacher / "config.json").is_file():
                P.resolve(options["student"], teacher, spec.task, DistillOptions.model_validate(options),
                          spec.trust_remote_code)

    @classmethod
    def cache_facts(cls, spec, options: dict) -> dict:
        """A pretrained student's content: another version of it behind the same name re-runs the pass."""
        return {"student_sha256": hash_dir(P.locate(options["student"]))} if options.get("student") else {}

    @staticmethod
    def summarize(rec: dict) -> str:
        """Student shape, how long and why it stopped, the held-out metric before -> after (teacher)."""
        st, tr, q = rec["student"], rec["training"], rec["quality"]
        metric = rec["selection"]["metric"]
        teacher = q["teacher"].get(metric)
        kind = f"pretrained {st['model']}: " if st.get("kind") == "pretrained" else ""
        line = (f"student {kind}{st['layers']} layers, heads {st['heads_per_layer']}, FFN {st['ffn_per_layer'][0]} "
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

        job = _Distillation.start(ctx, Path(src), Path(dst), options)
        tokenizer = job.check_pair()
        job.check_losses()
        job.load_data()
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(max(1, ctx.threads))
        try:
            return job.train(tokenizer)
        finally:
            torch.set_num_threads(previous_threads)


def _load(spec, path: Path, eager: bool):
    model = load_torch_model(spec, path)
    if eager:  # attention maps are only returned by the eager implementation
        model.set_attn_implementation("eager")
    return model


def _device(options: DistillOptions):
    import torch

    want_cuda = options.device == "cuda" or (options.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if want_cuda else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError("device: cuda asked for, but no CUDA device is available; use device: auto or cpu")
    return device


def _layer_map(options: DistillOptions, origins: list[int] | None, n_student: int, teacher_layers: int) -> list[int]:
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
    return layer_map


@dataclass
class _Data:
    train: object  # TextDataset
    heldout: object
    notes: dict
    has_labels: bool
    extra_texts: list[str]


@dataclass
class _Pair:
    """The teacher and the student, ready to train (layers dropped, layer map chosen)."""
    teacher: object
    student: object
    teacher_layers: int
    origins: list[int] | None  # the teacher layer each student layer came from, when known
    source: str
    dropped_here: bool
    layer_map: list[int]
    arch: object  # where the student's layers live (its own family's row)
    teacher_params: int = 0


@dataclass
class _Targets:
    """The teacher's outputs the student learns from: cached (in memory, maybe reused from disk) or online."""
    cache: D.TeacherCache
    heldout: object  # the teacher's outputs on the evaluation rows
    from_disk: bool
    cache_mb: float
    cached_layers: list[int]
    online: bool


@dataclass
class _Distillation:
    """One distillation, step by step: checks, data, the pair, the teacher's targets, training, the record."""
    ctx: PassContext
    options: DistillOptions
    src: Path
    dst: Path
    choice: S.TeacherChoice
    arch: object
    objective: str
    started: float  # T.CLOCK() at the start: the time budget covers the teacher pass too
    wall_start: float
    weights: dict = field(default_factory=dict)
    data: _Data | None = None
    device: object = None
    pretrained: P.PretrainedStudent | None = None  # the ``student`` option's model
    teacher_tokenizer: object = None  # set when the pretrained student reads other token ids than the teacher

    @property
    def student_dir(self) -> Path:
        return self.pretrained.path if self.pretrained is not None else self.src

    @property
    def teacher_how(self) -> str:
        return "the input model (the student is pretrained)" if self.pretrained is not None else self.choice.how

    @classmethod
    def start(cls, ctx: PassContext, src: Path, dst: Path, options: DistillOptions) -> _Distillation:
        started, wall_start = T.CLOCK(), time.perf_counter()
        choice = S.resolve_teacher(src, ctx.spec.path, options.teacher)
        pretrained = None
        if options.student:
            if not choice.student_from_teacher:
                raise InputError(f"distill student {options.student}: a pretrained student replaces the input stage, "
                                 f"and the input {src} is not the teacher (the teacher is {choice.how}); run distill "
                                 "with student: on the teacher itself (no prune before it)")
            pretrained = P.resolve(options.student, choice.path, ctx.spec.task, options, ctx.spec.trust_remote_code)
        return cls(ctx=ctx, options=options, src=src, dst=dst, arch=arch_for(ctx.spec.model_type), choice=choice,
                   objective=ctx.spec.task_def.torch_objective, started=started, wall_start=wall_start,
                   pretrained=pretrained)

    def check_pair(self):
        """Teacher and student are one family with one vocabulary (or the student is pretrained, and reads its
        own tokens when its vocabulary differs): the student's tokenizer."""
        choice, src, trust = self.choice, self.src, self.ctx.spec.trust_remote_code
        teacher_cfg = json.loads((choice.path / "config.json").read_text())
        if self.pretrained is not None:
            S.check_teacher_head(self.objective, teacher_cfg, choice.path)
            if not self.pretrained.same_tokenizer:
                self.teacher_tokenizer = load_tokenizer(choice.path, trust)
            return load_tokenizer(self.pretrained.path, trust)
        student_cfg = json.loads((src / "config.json").read_text())
        if teacher_cfg.get("model_type") != student_cfg.get("model_type"):
            raise InputError(f"teacher {choice.path} is a {teacher_cfg.get('model_type')!r} model and the student "
                             f"{src} a {student_cfg.get('model_type')!r} one; distill within one architecture family")
        student_tok = load_tokenizer(src, trust)
        try:
            teacher_tok = load_tokenizer(choice.path, trust)
        except Exception:  # noqa: BLE001 - no (fast) tokenizer files: the vocabulary size is still compared
            teacher_tok = None
        # hidden states go through a projection when the widths differ; attention maps and relations are L x L
        S.check_compatible(self.objective, teacher_cfg, student_cfg, teacher_tok, student_tok, choice.path, src,
                           need_same_hidden=False)
        return student_tok

    def _weights(self, has_labels: bool) -> dict:
        o = self.options
        return L.weights_for(self.objective, has_labels, alpha=o.alpha, mse_weight=o.mse_weight,
                             cosine_weight=o.cosine_weight, hidden_weight=o.hidden_weight,
                             attention_weight=o.attention_weight, relation_weight=o.relation_weight)

    def check_losses(self) -> None:
        options, labelled = self.options, self.objective == "logits"
        offered = self.arch.layout.distill_terms
        for term, weight in (("hidden_mse", options.hidden_weight), ("attention_mse", options.attention_weight),
                             ("relation_kl", options.relation_weight)):
            if weight > 0 and term not in offered:
                raise InputError(f"{term} is not offered for {self.ctx.spec.model_type} (its family row offers "
                                 f"{', '.join(offered) or 'none'}); set {term.split('_')[0]}_weight to 0")
        if not self._weights(True):
            raise InputError("every loss weight is 0: nothing to train on; raise alpha, mse_weight or cosine_weight")
        if options.select == "cosine" and labelled or options.select in ("accuracy", "agreement", "kl_to_teacher") \
                and not labelled:
            raise InputError(f"select: {options.select} does not apply to {self.objective}; use auto")

    def load_data(self) -> None:
        train_set, heldout_set, notes = load_sets(self.ctx, self.options, self.objective == "logits")
        has_labels = self.objective == "logits" and train_set.labels is not None
        self.weights = self._weights(has_labels)
        extra_texts, notes["extra_texts"] = extra_training_texts(self.options, train_set)
        self.data = _Data(train_set, heldout_set, notes, has_labels, extra_texts)
        how = self.teacher_how
        student = f"student pretrained {self.pretrained.source} ({self.pretrained.model_type}" + (
            ", the teacher's tokenizer); " if self.pretrained.same_tokenizer else ", its own tokenizer: logit-level); ") \
            if self.pretrained is not None else ""
        self.ctx.log(f"distill: teacher {self.choice.path} ({how}); {student}{len(train_set)} training rows "
                     f"({'labelled' if has_labels else 'no labels'}), {len(heldout_set)} evaluation rows")

    def pair(self) -> _Pair:
        options, arch, spec = self.options, self.arch, self.ctx.spec
        eager = options.attention_weight > 0
        teacher = _load(spec, self.choice.path, eager)
        teacher.requires_grad_(False)
        teacher_layers = len(arch.layers(teacher))
        student_arch = arch_for(self.pretrained.model_type) if self.pretrained is not None else arch
        if self.pretrained is not None:
            student = P.load(self.pretrained, spec.task_def, teacher.config.to_dict(), spec.trust_remote_code, eager)
            origins, source = None, f"pretrained {self.pretrained.source} ({self.pretrained.path})"
            keep = S.choose_layers(len(student_arch.layers(student)), options.student_layers, options.keep_layers,
                                   default_half=False)
        elif self.choice.student_from_teacher:
            student = copy.deepcopy(teacher)
            origins = list(range(teacher_layers))
            source = "cut from the teacher (layers dropped)"
            keep = S.choose_layers(teacher_layers, options.student_layers, options.keep_layers, default_half=True)
            if keep is None or len(keep) == teacher_layers:
                raise InputError(f"the student would keep all {teacher_layers} layers of the teacher: nothing to distill "
                                 "into; give student_layers below that, or a pruned student (run prune first)")
        else:
            student = _load(spec, self.src, eager)
            origins = S.prune_origins(self.src)
            source = "the input stage" + (" (pruned; layer origins from its prune record)" if origins else "")
            n = len(arch.layers(student))
            if origins is None or len(origins) != n:
                origins = list(range(n)) if n == teacher_layers else None
            keep = S.choose_layers(n, options.student_layers, options.keep_layers, default_half=False)
        if keep is not None:
            S.drop_layers(student, student_arch, keep)
            origins = [origins[i] for i in keep] if origins is not None else None
        student.requires_grad_(True)
        if options.freeze_embeddings:
            student.get_input_embeddings().weight.requires_grad_(False)
        layer_map = _layer_map(options, origins, len(student_arch.layers(student)), teacher_layers)
        teacher.to(self.device)
        student.to(self.device)
        return _Pair(teacher, student, teacher_layers, origins, source, keep is not None, layer_map, student_arch,
                     sum(p.numel() for p in teacher.parameters()))

    def encode(self, tokenizer) -> tuple[D.Encoded, D.Encoded]:
        data, max_length = self.data, self.options.max_length
        train_enc = D.encode(tokenizer, data.train.texts, data.train.text_pairs,
                             data.train.labels if data.has_labels else None, max_length)
        if data.extra_texts:  # teacher-labelled rows: soft targets only (label -100, skipped by the cross-entropy)
            extra = D.encode(tokenizer, data.extra_texts, None, None, max_length)
            train_enc.ids += extra.ids
            if train_enc.types is not None:
                train_enc.types += extra.types or [np.zeros_like(i) for i in extra.ids]
            if train_enc.labels is not None:
                train_enc.labels = np.concatenate([train_enc.labels, np.full(len(extra), -100, dtype=np.int64)])
        heldout_enc = D.encode(tokenizer, data.heldout.texts, data.heldout.text_pairs,
                               data.heldout.labels if self.objective == "logits" else None, max_length)
        return train_enc, heldout_enc

    def relations(self, pair: _Pair) -> tuple | None:
        """MiniLM's relation loss: the last student layer against its mapped teacher layer."""
        if self.options.relation_weight <= 0:
            return None
        arch, last = self.arch, pair.arch.layers(pair.student)[-1]
        t_last = arch.layers(pair.teacher)[pair.layer_map[-1] - 1]
        heads = relation_heads(arch.heads(last) * arch.head_dim(last), arch.heads(t_last) * arch.head_dim(t_last),
                               arch.head_dim(t_last))
        return len(arch.layers(pair.student)) - 1, pair.layer_map[-1] - 1, heads, arch

    def teacher_targets(self, pair: _Pair, train_enc, heldout_enc, accepts, relations, teacher_hash: str) -> _Targets:
        options, ctx = self.options, self.ctx
        need_hidden = options.hidden_weight > 0
        hidden_size = self.arch.hidden(pair.teacher.config)
        layer_map = pair.layer_map
        cache_mb = D.hidden_cache_mb(train_enc.lengths, hidden_size, len(set(layer_map))) if need_hidden else 0.0
        online = options.attention_weight > 0 or relations is not None or (need_hidden and cache_mb > options.teacher_cache_mb)
        cached_layers = sorted(set(layer_map)) if need_hidden and not online else []
        # On disk, keyed by the teacher's weights and config, the tokenized rows and the cached layers: a shape
        # search (or a rerun) pays for the teacher pass once; a changed teacher or data set misses the key.
        disk_key = hashlib.sha256(json.dumps([teacher_hash, self.objective, D.ids_digest(train_enc, heldout_enc),
                                              cached_layers]).encode())
        disk_path = store("distill-teacher") / f"{disk_key.hexdigest()[:24]}.safetensors"
        reused = None if online else self.cached_targets(disk_path, train_enc, heldout_enc, cached_layers, layer_map)
        if reused is not None:
            ctx.log(f"distill: teacher outputs reused from {disk_path}")
            return _Targets(reused[0], reused[1], True, cache_mb, cached_layers, online)
        ctx.log(f"distill: teacher pass over {len(train_enc)} training rows" + (
            f" (caching {len(cached_layers)} hidden layers, {cache_mb:.0f} MB float16)" if cached_layers else ""))
        cache = D.teacher_outputs(pair.teacher, train_enc, self.objective, accepts, cached_layers, 64, self.device,
                                  progress=progress.tracker("distill: teacher pass (batches)"))
        heldout_teacher = D.teacher_outputs(pair.teacher, heldout_enc, self.objective, accepts, [], 64, self.device).main
        try:
            D.save_cached_main(disk_path, cache.main, heldout_teacher, cache)
        except OSError as exc:  # a read-only cache only costs the next run the teacher pass
            ctx.log(f"distill: teacher outputs not kept on disk ({exc})")
        if cached_layers:  # the cache is indexed by position in cached_layers
            position = {j: p for p, j in enumerate(cached_layers)}
            cache.hidden = [cache.hidden[position[j]] for j in layer_map]
        return _Targets(cache, heldout_teacher, False, cache_mb, cached_layers, online)

    @staticmethod
    def cached_targets(path: Path, train_enc, heldout_enc, cached_layers: list[int], layer_map: list[int]):
        """(TeacherCache, held-out outputs) from ``path`` when it holds every row and cached layer; else None."""
        on_disk = D.load_cached_main(path)
        if not on_disk or on_disk[0] is None or len(on_disk[0]) != len(train_enc) or len(on_disk[1]) != len(heldout_enc):
            return None
        train, heldout, hidden, offsets = on_disk
        if set(cached_layers) - set(hidden) or (cached_layers and offsets is None):
            return None
        states = [hidden[j] for j in layer_map] if cached_layers else None
        touch(path)
        return D.TeacherCache(train, list(cached_layers), states, offsets if cached_layers else None, 0.0), heldout

    def settings(self, layer_map: list[int], relations) -> T.Settings:
        options = self.options
        budget = options.max_minutes * 60 if options.max_minutes else None
        if budget and options.qat:  # the QAT phase's share of the budget is kept for it
            budget = budget * (1 - Q.budget_share(options.epochs, options.qat_epochs))
        if budget and not options.teacher_pass_in_budget:  # the clock started before loading and the teacher pass
            budget += T.CLOCK() - self.started
        return T.Settings(
            objective=self.objective, weights=self.weights, temperature=options.temperature, layer_map=layer_map,
            lr=options.lr, weight_decay=options.weight_decay, warmup=options.warmup, epochs=options.epochs,
            max_steps=options.max_steps, max_seconds=budget,
            batch_size=options.batch_size, eval_every=options.eval_every, patience=options.patience,
            min_delta=options.min_delta, stop_at=options.stop_at, select=options.select, keep=options.keep,
            grad_clip=options.grad_clip,
            checkpoint_every=options.checkpoint_every, seed=options.seed, log_every_seconds=options.log_every_seconds,
            relations=relations)

    def student_facts(self, pair: _Pair) -> dict:
        """The student in the record: which kind (pruned: cut from the teacher; pretrained: another model), its
        shape, and its size as shares of the teacher's parameters and encoder FLOPs."""
        shape = current_shape(pair.student, pair.arch)
        params = int(sum(p.numel() for p in pair.student.parameters()))
        teacher_cfg = json.loads((self.choice.path / "config.json").read_text())
        pretrained = self.pretrained
        return {"kind": "pretrained" if pretrained is not None else "pruned", "source": pair.source,
                "model": pretrained.source if pretrained is not None else None,
                "model_type": pair.student.config.model_type,
                "same_tokenizer": pretrained.same_tokenizer if pretrained is not None else True,
                "layers": shape.num_layers, "heads_per_layer": shape.heads, "ffn_per_layer": shape.ffn,
                "hidden": shape.hidden, "params": params, "origins": pair.origins, "dropped_here": pair.dropped_here,
                **P.size_facts(shape, params, teacher_cfg, pair.teacher_params)}

    def identity(self, student_hash: str, teacher_hash: str) -> str:
        """What a checkpoint must match to be resumed: inputs, data and the options that change learning."""
        return hashlib.sha256(json.dumps({
            "student": student_hash, "teacher": teacher_hash if not self.choice.student_from_teacher else "input",
            "objective": self.objective, "data": texts_digest(self.data.train, self.data.heldout),
            "options": {k: v for k, v in self.options.model_dump().items() if k not in NOT_IN_IDENTITY},
        }, sort_keys=True, default=str).encode()).hexdigest()

    def qat(self, trainer_kwargs: dict, settings: T.Settings) -> dict:
        options, quant = self.options, self.ctx.target.quant
        return Q.run_phase(
            trainer_cls=T.Trainer, trainer_kwargs=trainer_kwargs, settings=settings, qat_epochs=options.qat_epochs,
            lr=options.qat_lr or options.lr / 2,
            per_channel=quant.per_channel if options.qat_per_channel is None else options.qat_per_channel,
            reduce_range=quant.reduce_range if options.qat_reduce_range is None else options.qat_reduce_range,
            max_seconds=options.max_minutes * 60 if options.max_minutes else None)

    def train(self, tokenizer) -> dict:
        import torch

        options = self.options
        torch.manual_seed(options.seed)
        self.device = _device(options)
        pair = self.pair()
        student = pair.student
        accepts = set(inspect.signature(student.forward).parameters)
        train_enc, heldout_enc = self.encode(tokenizer)
        # the teacher reads the same texts through its own tokenizer when the student's differs (rows align by text)
        teacher_rows = self.encode(self.teacher_tokenizer) if self.teacher_tokenizer is not None else (train_enc, heldout_enc)
        relations = self.relations(pair)
        if options.hidden_weight > 0:
            s_hidden, t_hidden = pair.arch.hidden(student.config), self.arch.hidden(pair.teacher.config)
            if s_hidden != t_hidden:
                student.distill_projection = torch.nn.Linear(s_hidden, t_hidden).to(self.device)
        teacher_hash = hash_dir(self.choice.path)
        cut_here = self.choice.student_from_teacher and self.pretrained is None
        student_hash = teacher_hash if cut_here else hash_dir(self.student_dir)
        teacher_accepts = set(inspect.signature(pair.teacher.forward).parameters)
        targets = self.teacher_targets(pair, *teacher_rows, teacher_accepts, relations, teacher_hash)
        if not targets.online:
            pair.teacher = None  # its outputs are all in the cache now
        settings = self.settings(pair.layer_map, relations)
        identity = self.identity(student_hash, teacher_hash)
        root = Path(options.checkpoint_dir) if options.checkpoint_dir else ckpt.default_root(identity)
        trainer_kwargs = dict(student=student, teacher=pair.teacher, settings=settings, train=train_enc,
                              heldout=heldout_enc, cache=targets.cache, heldout_teacher=targets.heldout,
                              accepts=accepts, device=self.device, started=self.started, checkpoint_root=root,
                              identity=identity, resume=options.resume, online_teacher=targets.online)
        result = T.Trainer(**trainer_kwargs).run()
        qat_record = self.qat(trainer_kwargs, settings) if options.qat else None
        projected = hasattr(student, "distill_projection")
        if projected:  # a training aid, not part of the student
            del student.distill_projection
        student.to("cpu").eval()
        student.save_pretrained(self.dst)
        if self.pretrained is not None:
            P.copy_files(self.pretrained, self.dst, self.objective)
        else:
            copy_side_files(self.src, self.dst)
        reload = _reload_check(self.ctx, student, self.dst, heldout_enc, accepts)
        ckpt.remove(root)
        record = self.record(pair, heldout_enc, targets, result, relations, projected, root)
        record.update({"qat": qat_record, "reload_check": reload, "weights_sha256": weights_sha256(student),
                       "pass_seconds": round(time.perf_counter() - self.wall_start, 2)})
        try:
            plot_training_curve(record, self.dst / CURVE, title=f"{self.ctx.spec.source}: distill")
            record["curve"] = CURVE
        except Exception as exc:  # noqa: BLE001 - a plot is never worth the run
            self.ctx.log(f"{CURVE} not written: {type(exc).__name__}: {exc}")
            record["curve"] = None
        return record

    def record(self, pair: _Pair, heldout_enc, targets: _Targets, result: T.Result, relations, projected: bool,
               root: Path) -> dict:
        import torch

        options, data, arch = self.options, self.data, self.arch
        teacher = teacher_metrics(self.objective, targets.heldout, heldout_enc)
        return {
            "teacher": {"path": str(self.choice.path), "how": self.teacher_how, "layers": pair.teacher_layers,
                        "metrics_on_eval_rows": teacher},
            "student": self.student_facts(pair),
            "losses": {
                "weights": self.weights, "temperature": options.temperature, "layer_map": pair.layer_map if (
                    options.hidden_weight or options.attention_weight or options.relation_weight) else None,
                "hidden_projection": projected, "relation_layers": [relations[0], relations[1]] if relations else None,
                "relation_heads": relations[2] if relations else None,
                "family_terms": list(arch.layout.distill_terms),
                "definitions": LOSS_DEFINITIONS[self.objective],
            },
            "data": {
                "train": {"source": data.train.source, "rows": len(data.train), "labelled": data.has_labels},
                "eval": {"source": data.heldout.source, "rows": len(data.heldout),
                         "labelled": heldout_enc.labels is not None},
                **data.notes, "max_length": options.max_length, "batch_size": options.batch_size,
                "teacher_outputs": {"mode": "online" if targets.online else "cached",
                                    "tokenized_by": "the teacher's own tokenizer (the student's differs)"
                                    if self.teacher_tokenizer is not None else "the student's (one vocabulary)",
                                    "seconds": round(targets.cache.seconds, 2), "reused_from_disk": targets.from_disk,
                                    "hidden_cache_mb": round(targets.cache_mb, 1) if targets.cached_layers else 0.0},
            },
            "training": {
                "steps": result.steps, "epochs": result.epochs, "stopped_because": result.stopped_because,
                "lr": options.lr, "warmup": options.warmup, "schedule": "linear warm-up, then linear decay to 0 at the horizon",
                "horizon": result.horizon, "seconds": result.seconds, "device": str(self.device),
                "threads": torch.get_num_threads(), "seed": options.seed,
                "resumed_from_step": result.resumed_from_step, "resumed_from_steps": result.extra["resumed_from_steps"],
                "checkpoints_written": result.checkpoints_written,
                "checkpoint_dir": str(root), "eval_every": result.extra["eval_every"],
                "max_minutes": options.max_minutes, "teacher_pass_in_budget": options.teacher_pass_in_budget,
            },
            "evaluations": result.history,
            "selection": {"metric": result.extra["metric"], "best_step": result.best_step, "keep": options.keep,
                          "kept_step": result.kept_step},
            "quality": {"teacher": teacher, "before": metrics_only(result.before),
                        "after": metrics_only(result.kept), "eval_rows": len(data.heldout)},
        }


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
