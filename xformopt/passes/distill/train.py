"""The distillation loop: AdamW, warm-up then linear decay, a time budget, held-out evaluation, early
stopping, best-checkpoint selection, resumable checkpoints.

Schedule. The learning rate rises linearly over the first ``warmup`` fraction of the planned steps,
then decays linearly to zero at the horizon: ``min(max_steps, epochs x steps per epoch)``. With a
time budget the horizon is re-planned every 20 steps from the time of the latest 200 steps and of the
evaluations, so that the decay ends inside the budget; it never exceeds the plan, and grows back
when a burst of load elsewhere has passed. The record lists each change of more than 2%. Runs with a
time budget that bites therefore depend on the machine's speed; for bit-for-bit reproducible runs
give ``max_steps``/``epochs`` and no ``max_minutes`` (or one that does not bite).

Stops: ``steps`` (max_steps reached), ``epochs`` (all epochs done), ``time`` (the budget, including
a horizon shortened to fit it), ``early_stop`` (``patience`` evaluations without an improvement
larger than ``min_delta``), ``converged`` (the selection metric reached ``stop_at``).

Interruption. Ctrl-C (SIGINT, main thread) finishes the current step, writes a checkpoint and
raises KeyboardInterrupt; a second Ctrl-C aborts at once. Checkpoints are also written every
``checkpoint_every`` steps. Rerunning the same command resumes from the latest checkpoint and, with
the same threads and no time budget biting, ends with bit-identical weights.

``CLOCK`` and ``ON_STEP`` are module attributes so tests can inject a fake clock and simulate an
interruption without sleeping or sending signals.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from xformopt import progress
from xformopt.errors import PassFailed
from xformopt.passes.distill import checkpoint as ckpt
from xformopt.passes.distill import losses as L
from xformopt.passes.distill.data import (
    Encoded,
    TeacherCache,
    collate,
    epoch_batches,
    forward,
    sorted_batches,
    steps_per_epoch,
)
from xformopt.passes.distill.relations import QKV

_log = logging.getLogger(__name__)

CLOCK: Callable[[], float] = time.monotonic
ON_STEP: Callable[[int, Trainer], None] | None = None  # called after every optimizer step (tests)
REPLAN_EVERY = 20
SPEED_WINDOW = 200  # steps the speed estimate averages over: batches differ in length, so fewer are noisy

HIGHER_IS_BETTER = {"accuracy": True, "agreement": True, "cosine": True, "kl_to_teacher": False}


@dataclass
class Settings:
    objective: str
    weights: dict[str, float]
    temperature: float
    layer_map: list[int]  # teacher hidden-state index per student layer
    lr: float
    weight_decay: float
    warmup: float
    epochs: float
    max_steps: int | None
    max_seconds: float | None
    batch_size: int
    eval_every: int | None
    patience: int
    min_delta: float
    stop_at: float | None
    select: str
    grad_clip: float
    checkpoint_every: int
    seed: int
    log_every_seconds: float = 30.0
    keep: str = "best"  # the weights returned: the best evaluation's ("best") or the last step's ("last")
    # relation loss: (student layer, teacher layer) 0-based, relation heads, and the family's Arch
    relations: tuple | None = None


@dataclass
class LoopState:
    """What a checkpoint carries of the loop (``asdict`` of it is the checkpoint's state.json)."""
    step: int = 0
    horizon: int = 1
    planned: int = 1
    warm: int = 0
    history: list[dict] = field(default_factory=list)
    best_step: int = 0
    best_score: list | None = None
    bad_evals: int = 0
    elapsed: float = 0.0
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    loss_sum: float = 0.0
    loss_n: int = 0
    term_sums: dict[str, float] = field(default_factory=dict)
    replans: list[dict] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)
    last_eval_step: int | None = None
    last_eval_duration: float = 0.0


@dataclass
class _Session:
    """This process's share of a run (a resumed run starts a new one): speed and checkpoints written."""
    start: float
    steps: int = 0
    train_seconds: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=SPEED_WINDOW))  # latest step durations
    checkpoints: int = 0


@dataclass
class Result:
    history: list[dict]
    best_step: int
    kept_step: int
    kept: dict  # the evaluation of the weights returned (the best one's, or the last one's)
    before: dict
    steps: int
    epochs: float
    stopped_because: str
    horizon: dict
    seconds: dict
    resumed_from_step: int | None
    checkpoints_written: int
    interrupted: bool = False
    extra: dict = field(default_factory=dict)


def lr_at(step: int, peak: float, warm: int, horizon: int) -> float:
    """Learning rate for the update that follows ``step`` completed steps."""
    if step < warm:
        return peak * (step + 1) / warm
    return peak * max(0.0, (horizon - step) / max(1, horizon - warm))


def selection_metric(select: str, objective: str, has_labels: bool) -> str:
    if select != "auto":
        return select
    if objective == "embedding":
        return "cosine"
    return "accuracy" if has_labels else "agreement"


class Progress:
    """Training progress: to the live display (xformopt.progress) when one listens (a terminal),
    else a log line every ``every`` seconds with step, loss, learning rate, speed and ETA (the
    training loop knows a better ETA than a generic rate: the horizon moves under a time budget)."""

    def __init__(self, every: float):
        self.every = every
        self.last = -math.inf
        self.step, self.horizon = 0, 1

    def update(self, step: int, horizon: int, loss: float, lr: float, rate: float, eta: float, now: float) -> None:
        info = f"loss {loss:.4f} lr {lr:.2e} {rate:.2f} steps/s"
        self.step, self.horizon = step, horizon
        if progress.interactive():
            progress.report("distill (steps)", step, horizon, info)
            return
        if now - self.last >= self.every:
            self.last = now
            _log.info(f"distill: step {step}/{horizon} ({step / max(horizon, 1):.0%}), {info}, ETA {fmt_seconds(eta)}")

    def close(self) -> None:
        if progress.interactive():  # stopped early (patience, time, Ctrl-C): the bar ends here too
            progress.report("distill (steps)", self.horizon, self.horizon)


def fmt_seconds(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(round(s))
    return f"{s // 60}:{s % 60:02d}"


class Trainer:
    def __init__(self, *, student, teacher, settings: Settings, train: Encoded, heldout: Encoded,
                 cache: TeacherCache, heldout_teacher, accepts: set[str], device, started: float,
                 checkpoint_root: Path, identity: str, resume: bool, online_teacher: bool):
        self.student, self.teacher, self.s = student, teacher, settings
        self.train_data, self.heldout = train, heldout
        self.cache, self.heldout_teacher = cache, heldout_teacher
        self.accepts, self.device = accepts, device
        self.started = started  # CLOCK() when the pass began: the time budget covers the teacher pass too
        self.root, self.identity, self.resume = Path(checkpoint_root), identity, resume
        self.online = online_teacher
        self.interrupt_requested = False
        self.lengths = train.lengths
        self.spe = steps_per_epoch(len(train), settings.batch_size)
        self.metric = selection_metric(settings.select, settings.objective, heldout.labels is not None)
        self.heldout_batches = sorted_batches(heldout.lengths, 64)
        self.need_hidden = "hidden_mse" in settings.weights
        self.need_attn = "attention_mse" in settings.weights
        self.need_rel = "relation_kl" in settings.weights and settings.relations is not None
        # hidden states through a learned projection when the widths differ (an attribute of the student,
        # so the optimizer, the checkpoints and the best state carry it; the pass removes it before saving)
        self.projection = getattr(student, "distill_projection", None)
        self.captures = None
        self.state = LoopState()
        self.best_state = None  # the best evaluation's weights (CPU)
        self.prior_elapsed = 0.0  # seconds spent in earlier sessions of a resumed run
        self.session = _Session(start=CLOCK())
        self.eval_every = max(1, self.spe // 2)

    # ------------------------------------------------------------------ evaluation

    def evaluate(self) -> dict:
        import torch

        was_training = self.student.training
        self.student.eval()
        outs = [None] * len(self.heldout)
        with torch.inference_mode():
            for idx in self.heldout_batches:
                enc = {k: v.to(self.device) for k, v in collate(self.heldout, idx, self.accepts).items()}
                main, _, _ = forward(self.student, enc, self.s.objective)
                main = main.float().cpu()
                for r, i in enumerate(idx):
                    outs[i] = main[r]
        self.student.train(was_training)
        student, teacher = torch.stack(outs), self.heldout_teacher
        if self.s.objective == "logits":
            pred, tpred = student.argmax(-1), teacher.argmax(-1)
            m = {"agreement": float((pred == tpred).float().mean()),
                 "kl_to_teacher": float(L.soft_kl(student, teacher, 1.0))}
            if self.heldout.labels is not None:
                m = {"accuracy": float((pred == torch.from_numpy(self.heldout.labels)).float().mean()), **m}
        else:
            cos = torch.nn.functional.cosine_similarity(student, teacher, dim=-1)
            m = {"cosine": float(cos.mean()), "min_cosine": float(cos.min()),
                 "mse": float(L.embedding_mse(student, teacher))}
        return {k: round(v, 6) for k, v in m.items()}

    def score(self, metrics: dict) -> tuple:
        sign = 1.0 if HIGHER_IS_BETTER[self.metric] else -1.0
        tie = metrics.get("agreement", metrics.get("min_cosine", 0.0)) if self.metric == "accuracy" else 0.0
        return (sign * metrics[self.metric], tie)

    # ------------------------------------------------------------------ one step

    def loss_terms(self, idx) -> dict:
        import torch

        enc = {k: v.to(self.device) for k, v in collate(self.train_data, idx, self.accepts).items()}
        s_main, s_hid, s_att = forward(self.student, enc, self.s.objective, hidden=self.need_hidden, attentions=self.need_attn)
        t_states = t_att = None
        if self.online:
            with torch.no_grad():
                t_main, t_hid, t_att = forward(self.teacher, enc, self.s.objective, hidden=self.need_hidden,
                                               attentions=self.need_attn)
            if self.need_hidden:
                t_states = [t_hid[j] for j in self.s.layer_map]
        else:
            t_main = self.cache.main[torch.as_tensor(idx)].to(self.device)
            if self.need_hidden:
                width = enc["input_ids"].shape[1]
                t_states = [h.to(self.device) for h in self.cache.hidden_batch(idx, self.lengths, width)]
        w = self.s.weights
        terms = {}
        if self.s.objective == "logits":
            terms["soft_kl"] = L.soft_kl(s_main, t_main, self.s.temperature)
            if "hard_ce" in w:
                terms["hard_ce"] = L.hard_ce(s_main, torch.from_numpy(self.train_data.labels[idx]).to(self.device))
        else:
            if "embedding_mse" in w:
                terms["embedding_mse"] = L.embedding_mse(s_main, t_main)
            if "embedding_cosine" in w:
                terms["embedding_cosine"] = L.embedding_cosine(s_main, t_main)
        mask = enc["attention_mask"]
        if self.need_hidden:
            states = list(s_hid[1:])
            if self.projection is not None:
                states = [self.projection(h) for h in states]
            terms["hidden_mse"] = L.hidden_mse(states, t_states, mask)
        if self.need_rel:
            s_qkv, t_qkv = self.captures[0].take(), self.captures[1].take()
            terms["relation_kl"] = L.relation_kl(s_qkv, t_qkv, mask, self.s.relations[2])
        if self.need_attn:
            terms["attention_mse"] = L.attention_mse(list(s_att), [t_att[j - 1] for j in self.s.layer_map], mask)
        return terms

    # ------------------------------------------------------------------ the loop

    def _optimizer(self):
        import torch

        decay, no_decay = [], []
        for name, p in self.student.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
        return torch.optim.AdamW([{"params": decay, "weight_decay": self.s.weight_decay},
                                  {"params": no_decay, "weight_decay": 0.0}], lr=self.s.lr)

    def _sigint(self, signum, frame):
        if self.interrupt_requested:  # second Ctrl-C: abort now
            raise KeyboardInterrupt
        self.interrupt_requested = True
        _log.info("interrupt: finishing this step and writing a checkpoint (Ctrl-C again to abort at once)")

    def run(self) -> Result:
        s = self.s
        planned = math.ceil(s.epochs * self.spe)
        if s.max_steps is not None:
            planned = min(planned, s.max_steps)
        planned = max(planned, 1)
        self.state = LoopState(horizon=planned, planned=planned,
                               warm=max(1, math.ceil(s.warmup * planned)) if s.warmup else 0)
        optimizer = self._optimizer()
        if self.need_rel:
            s_layer, t_layer, _, arch = self.s.relations
            self.captures = (QKV(self.student, arch, s_layer), QKV(self.teacher, arch, t_layer))
        resumed_from = self._resume(optimizer)
        self.prior_elapsed = self.state.elapsed
        self.session = _Session(start=CLOCK())
        self.eval_every = s.eval_every or max(1, self.spe // 2)
        if self.state.step == 0 and not self.state.history:
            self._evaluate_now()  # the student before distillation: also a candidate for the best checkpoint
        before = dict(self.state.history[0])

        self.student.train()
        if self.teacher is not None:
            self.teacher.eval()
        meter = Progress(s.log_every_seconds)
        handler_installed = False
        if threading.current_thread() is threading.main_thread():
            previous_handler = signal.signal(signal.SIGINT, self._sigint)
            handler_installed = True
        try:
            stopped = self._loop(optimizer, meter)
        finally:
            meter.close()
            for capture in self.captures or ():
                capture.remove()
            if handler_installed:
                signal.signal(signal.SIGINT, previous_handler)
        if self.state.last_eval_step != self.state.step:
            self._evaluate_now()
        return self._result(stopped, before, resumed_from)

    # ------------------------------------------------------------------ the loop's parts

    def _elapsed(self) -> float:
        return self.prior_elapsed + CLOCK() - self.started

    def _resume(self, optimizer) -> int | None:
        """Load the latest checkpoint of this run, when asked and one exists: the step it resumes from."""
        loaded = ckpt.load(self.root, self.identity) if self.resume else None
        if not loaded:
            return None
        self.student.load_state_dict(loaded["student"])
        optimizer.load_state_dict(loaded["optimizer"])
        ckpt.restore_rng(loaded["rng"])
        self.best_state = loaded["best"]
        names = {f.name for f in fields(LoopState)}
        self.state = dataclasses.replace(self.state, **{k: v for k, v in loaded["state"].items() if k in names})
        resumed_from = self.state.step
        self.state.resumed_from = [*self.state.resumed_from, resumed_from]
        _log.info(f"resuming from the checkpoint at step {resumed_from} in {self.root}")
        return resumed_from

    def _save_checkpoint(self, optimizer) -> None:
        self.state.elapsed = self._elapsed()
        ckpt.save(self.root, identity=self.identity, student_state=ckpt.state_dict_cpu(self.student),
                  best_state=self.best_state, optimizer_state=optimizer.state_dict(), state=asdict(self.state))
        self.session.checkpoints += 1

    def _evaluate_now(self) -> dict:
        """A held-out evaluation at the current step: the history entry, the best checkpoint, patience."""
        s, state = self.s, self.state
        t = CLOCK()
        metrics = self.evaluate()
        duration = CLOCK() - t
        state.eval_seconds += duration
        state.last_eval_duration = duration
        step = state.step
        entry = {"step": step, "epoch": round(step / self.spe, 3), "seconds": round(self._elapsed(), 1),
                 "lr": lr_at(max(step - 1, 0), s.lr, state.warm, state.horizon) if step else 0.0}
        if state.loss_n:
            entry["train_loss"] = round(state.loss_sum / state.loss_n, 6)
            entry["train_steps"] = state.loss_n  # the steps that mean is over
            entry["train_terms"] = {k: round(v / state.loss_n, 6) for k, v in state.term_sums.items()}
        entry.update(metrics)
        state.loss_sum, state.loss_n, state.term_sums = 0.0, 0, {}
        score = self.score(metrics)
        best = state.best_score
        improved = best is None or tuple(score) > tuple(best)
        if best is None or score[0] > best[0] + s.min_delta:
            state.bad_evals = 0
        else:
            state.bad_evals += 1
        if improved:
            state.best_score, state.best_step = list(score), step
            self.best_state = ckpt.state_dict_cpu(self.student)
        entry["best_so_far"] = state.best_step
        state.history.append(entry)
        state.last_eval_step = step
        shown = ", ".join(f"{k} {entry[k]:.4f}" for k in ("train_loss", *metrics) if k in entry)
        _log.info(f"distill: eval at step {step} (epoch {entry['epoch']:.2f}): {shown}; best at step {state.best_step}")
        return metrics

    def _out_of_schedule(self) -> str | None:
        """Why the loop stops before the next step (horizon or time budget), else None; under a time
        budget the horizon is re-planned from the latest steps' speed."""
        s, state, step = self.s, self.state, self.state.step
        if step >= state.horizon:
            if state.horizon < state.planned:  # the budget shortened the schedule
                return "time"
            return "steps" if s.max_steps is not None and state.horizon == s.max_steps else "epochs"
        if s.max_seconds is None:
            return None
        reserve = state.last_eval_duration + 1.0
        if self._elapsed() + reserve >= s.max_seconds:
            return "time"
        recent = self.session.recent
        if recent and (self.session.steps == 10 or step % REPLAN_EVERY == 0):
            # Speed of the latest SPEED_WINDOW steps: a burst of load elsewhere shortens the
            # schedule only while it lasts (the horizon may grow back, up to the plan).
            per_step = sum(recent) / len(recent) + state.last_eval_duration / self.eval_every
            possible = step + int((s.max_seconds - self._elapsed() - reserve) / max(per_step, 1e-9))
            new = min(state.planned, max(step + 1, possible))
            if abs(new - state.horizon) > max(2, 0.02 * state.horizon):
                state.replans.append({"at_step": step, "from": state.horizon, "to": new})
                state.horizon = new
        return None

    def _step(self, optimizer, idx) -> tuple[float, float]:
        """One optimizer step on batch ``idx``: (loss, learning rate)."""
        import torch

        s, state, step = self.s, self.state, self.state.step
        lr = lr_at(step, s.lr, state.warm, state.horizon)
        for group in optimizer.param_groups:
            group["lr"] = lr
        terms = self.loss_terms(idx)
        loss = L.combine(terms, s.weights)
        if not torch.isfinite(loss):
            raise PassFailed(f"distillation diverged: loss is {float(loss)} at step {step}; lower lr "
                             f"(now {s.lr}) or the temperature")
        loss.backward()
        if s.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.student.parameters(), s.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state.step = step + 1
        state.loss_sum += float(loss.detach())
        state.loss_n += 1
        for k, v in terms.items():
            state.term_sums[k] = state.term_sums.get(k, 0.0) + float(v.detach())
        return float(loss.detach()), lr

    def _stop_after_eval(self, metrics: dict) -> str | None:
        s, state = self.s, self.state
        if s.patience and state.bad_evals >= s.patience:
            return "early_stop"
        if s.stop_at is not None and (metrics[self.metric] >= s.stop_at if HIGHER_IS_BETTER[self.metric]
                                      else metrics[self.metric] <= s.stop_at):
            return "converged"
        return None

    def _loop(self, optimizer, meter: Progress) -> str:
        """Steps until a stop; returns why it stopped."""
        s, state, session = self.s, self.state, self.session
        order_epoch, order = None, None
        while True:
            stopped = self._out_of_schedule()
            if stopped:
                return stopped
            epoch, pos = divmod(state.step, self.spe)
            if order_epoch != epoch:
                order, order_epoch = epoch_batches(self.lengths, s.batch_size, s.seed, epoch), epoch
            t = CLOCK()
            loss, lr = self._step(optimizer, order[pos])
            step = state.step
            if ON_STEP is not None:
                ON_STEP(step, self)
            dt = CLOCK() - t
            session.train_seconds += dt
            state.train_seconds += dt
            session.steps += 1
            session.recent.append(dt)
            if step % self.eval_every == 0 or step == state.horizon:
                stopped = self._stop_after_eval(self._evaluate_now())
            if self.interrupt_requested:
                self._save_checkpoint(optimizer)
                _log.info(f"checkpoint written at step {step} in {self.root}; rerun the same command to resume")
                raise KeyboardInterrupt
            if stopped:
                return stopped
            if s.checkpoint_every and step % s.checkpoint_every == 0 and step < state.horizon:
                self._save_checkpoint(optimizer)
            rate = session.steps / max(session.train_seconds, 1e-9)
            eta = (state.horizon - step) * (session.train_seconds / session.steps
                                            + state.last_eval_duration / self.eval_every)
            meter.update(step, state.horizon, loss, lr, rate, eta, CLOCK())

    def _result(self, stopped: str, before: dict, resumed_from: int | None) -> Result:
        s, state = self.s, self.state
        kept_step = state.best_step if s.keep == "best" else state.step
        if kept_step != state.step and self.best_state is not None:
            self.student.load_state_dict(self.best_state)
        kept = next(h for h in state.history if h["step"] == kept_step)
        return Result(
            history=state.history, best_step=state.best_step, kept_step=kept_step, kept=kept, before=before,
            steps=state.step, epochs=round(state.step / self.spe, 3), stopped_because=stopped,
            horizon={"planned": state.planned, "final": state.horizon, "warmup_steps": state.warm,
                     "steps_per_epoch": self.spe, "replans": state.replans},
            seconds={"training": round(state.train_seconds, 2), "evaluation": round(state.eval_seconds, 2),
                     "total_with_teacher_pass": round(self._elapsed(), 2),
                     "this_session": round(CLOCK() - self.session.start, 2)},
            resumed_from_step=resumed_from, checkpoints_written=self.session.checkpoints,
            extra={"resumed_from_steps": state.resumed_from, "eval_every": self.eval_every, "metric": self.metric},
        )
