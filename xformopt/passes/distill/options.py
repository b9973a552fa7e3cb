"""distill's options (the recipe's ``distill:`` keys and the command's flags), validated by pydantic: what
each means is in its description, which ``xformopt distill --help`` and the docs' recipe schema show."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from xformopt.passes.base import PassOptions


class DistillOptions(PassOptions):
    teacher: str | None = Field(None, description="teacher model directory; default: the run's input model "
                                                  "(single command: the model named in the input's manifest.json)")
    student: str | None = Field(None, description="a pretrained student instead of the input stage: a model folder or "
                                                  "a source name (minilm), given the teacher's head; with another "
                                                  "tokenizer, logit-level only (xformopt/passes/distill/pretrained.py)")
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
                                                     "of each training text (xformopt/passes/distill/augment.py)")
    layer_map: list[int] | None = Field(None, description="teacher hidden-state index (1-based) per student layer; "
                                                          "default: the layers the student came from")
    train_data: str | None = Field(None, description="training texts (labels optional); default: vendored train split")
    eval_data: str | None = Field(None, description="held-out texts for evaluation and early stopping; default: "
                                                    "vendored validation split (or part of train_data)")
    text_column: str | None = Field(None, description="text column of train_data/eval_data; default: guessed")
    text_pair_column: str | None = Field(None, description="second-sentence column for pair tasks")
    label_column: str | None = Field(None, description="'' trains on texts only (KL to the teacher, no labels)")
    train_samples: int | None = Field(None, ge=1, description="train on at most this many rows (seeded)")
    eval_samples: int | None = Field(None, ge=8, description="evaluate on at most this many rows (seeded)")
    batch_size: int = Field(32, ge=1, description="rows per training batch")
    max_length: int = Field(128, ge=8, description="truncate inputs to this many tokens")
    lr: float = Field(1e-4, gt=0, description="peak learning rate (AdamW)")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    warmup: float = Field(0.06, ge=0, lt=1, description="fraction of the planned steps spent warming up")
    epochs: float = Field(3.0, gt=0, description="passes over the training rows")
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimizer steps")
    max_minutes: float | None = Field(None, gt=0, description="time budget for the whole pass (teacher pass included)")
    teacher_pass_in_budget: bool = Field(True, description="max_minutes counts the teacher pass (and loading); false: "
                                                           "training alone gets max_minutes, so every shape of a shape "
                                                           "search trains as long whether it computed the teacher's "
                                                           "outputs or read them from disk")
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
    seed: int = Field(0, description="seed for data order, dropout and sampling")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when present, else CPU")
    teacher_cache_mb: int = Field(1024, ge=0, description="memory for cached teacher hidden states (float16); "
                                                          "above it the teacher runs beside the student")
    checkpoint_dir: str | None = Field(None, description="where resumable checkpoints go; default: under the xformopt cache")
    checkpoint_every: int = Field(200, ge=0, description="steps between checkpoints (0: only on Ctrl-C)")
    resume: bool = Field(True, description="continue from a checkpoint of the same run when one exists")
    log_every_seconds: float = Field(30.0, gt=0, description="progress line interval when stderr is not a terminal")
    qat: bool = Field(False, description="quantization-aware training in the last qat_epochs: the student's Linear "
                                         "layers see the target's dynamic INT8 (xformopt/passes/distill/qat.py)")
    qat_epochs: float = Field(1.0, gt=0, description="epochs of the quantization-aware phase (after the others)")
    qat_lr: float | None = Field(None, gt=0, description="peak learning rate of the QAT phase; default: lr / 2")
    qat_per_channel: bool | None = Field(None, description="QAT weight scales per channel; default: the target's")
    qat_reduce_range: bool | None = Field(None, description="QAT 7-bit weights; default: the target's")

    @model_validator(mode="after")
    def _exclusive(self):
        if self.student_layers is not None and self.keep_layers is not None:
            raise ValueError("student_layers and keep_layers are exclusive; give one")
        return self
