"""Recipes: a declarative pass chain, validated before any work starts.

A recipe is YAML (``yaml.safe_load`` only). Validation errors name the line and the field; a pass
in the wrong order names both passes and the reason. The resolved recipe (defaults filled in) is
saved in every artifact's manifest, so an artifact always carries the exact recipe that made it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from xformopt import safe_yaml
from xformopt.errors import InputError
from xformopt.passes import REGISTRY, all_passes, get_pass

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"


# Upper bounds keep a typo (an extra zero or three) from starting a run that never ends or a
# thread pool that hangs the host; they are far above any useful setting.
BatchSize = Annotated[int, Field(ge=1, le=4096)]
SeqLength = Annotated[int, Field(ge=1, le=131072)]


class EvaluationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data: str | None = Field(None, description="held-out file; default: the vendored VADER test split")
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    limit: int | None = Field(None, ge=1, le=10_000_000, description="evaluate on at most this many rows (seeded sample)")
    seed: int = Field(0, ge=0, le=2**32 - 1)
    threads: int | None = Field(None, ge=1, description="intra-op threads; default: the CPUs this process may use")
    latency_rounds: int = Field(100, ge=3, le=100_000, description="interleaved timing rounds at batch 1")
    warmup: int = Field(10, ge=0, le=10_000)
    repeats: int = Field(5, ge=1, le=1000, description="solo timing repeats of the artifact (their spread is the noise)")
    modes: list[Literal["real", "fixed", "throughput", "model"]] = Field(["real"], min_length=1)
    batch: list[BatchSize] = Field([1, 8, 32], min_length=1, max_length=64, description="batch sizes for fixed/throughput modes")
    seq: list[SeqLength] = Field([32, 128, 512], min_length=1, max_length=64, description="sequence lengths for fixed mode")
    fixed_rounds: int = Field(20, ge=3, le=100_000, description="interleaved rounds per fixed (batch, seq) cell")
    num_beams: int | None = Field(None, ge=1, le=64, description="text-to-text models: beam width the stages "
                                                                 "generate with; default: the model's generation config")


class PassStep(BaseModel):
    """One step: a registered pass name and its validated options."""

    name: str
    options: dict[str, Any] = Field(default_factory=dict)

    def to_yaml_obj(self) -> dict:
        return {self.name: self.options}


class ShapeChoice(BaseModel):
    """One prune shape the shape search may try (the prune pass's explicit-shape options), or a pretrained
    student of any family (``student: minilm``) distilled from the model in place of a pruned one."""

    model_config = ConfigDict(extra="forbid")

    layers: int | None = Field(None, ge=1, description="encoder layers kept")
    heads_per_layer: int | None = Field(None, ge=1, description="attention heads kept per layer")
    ffn_dim: int | None = Field(None, ge=1, description="FFN width kept per layer")
    hidden_size: int | None = Field(None, ge=1, description="hidden size (residual stream) kept")
    # relative to the model being pruned (one recipe for a 6-layer MiniLM and a 12-layer base model)
    layers_fraction: float | None = Field(None, gt=0, le=1, description="fraction of the layers kept")
    heads_fraction: float | None = Field(None, gt=0, le=1, description="fraction of the heads kept per layer")
    ffn_fraction: float | None = Field(None, gt=0, le=1, description="fraction of the FFN width kept")
    hidden_fraction: float | None = Field(None, gt=0, le=1, description="fraction of the hidden size kept")
    distill_minutes: float | None = Field(None, gt=0, description="distill's max_minutes for this shape "
                                                                  "[default: the recipe's]")
    student: str | None = Field(None, min_length=1, description="a pretrained student instead of a pruned shape: a "
                                                                "model folder or a source name (minilm); skipped "
                                                                "when it is not smaller than the model")


class ShapeSearch(BaseModel):
    """With an accuracy budget (``--max-accuracy-drop``), the prune shape is chosen per task: the
    shapes are tried from the fewest FLOPs up and the fastest one within the budget on the validation
    rows is kept (xformopt/recipe_search/shapes.py). Without a budget the recipe's own prune shape runs."""

    model_config = ConfigDict(extra="forbid")

    shapes: list[ShapeChoice] = Field(min_length=1, max_length=16)
    order: Literal["measured", "flops"] = Field(
        "measured", description="the order shapes are tried in: measured (each shape cut from the model untrained, "
                                "exported, fused and timed interleaved on this host, fastest first) or flops (fewest "
                                "encoder FLOPs first, nothing timed)")
    max_minutes: float = Field(60.0, gt=0, le=24 * 60, description="time budget of the whole search")
    keep_trials: bool = Field(False, description="keep each shape's artifact beside -o (DIR.shape-search/)")


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "custom"
    description: str = ""
    target: str = "auto"
    task: str | None = None
    passes: list[PassStep] = Field(min_length=1)
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings)
    shape_search: ShapeSearch | None = Field(None, description="per-task prune shape under --max-accuracy-drop")

    @field_validator("passes", mode="before")
    @classmethod
    def _steps(cls, value):
        """Accept ``- export`` and ``- export: {opset: 17}`` forms."""
        if not isinstance(value, list):
            return value
        steps = []
        for item in value:
            if isinstance(item, str):
                steps.append({"name": item, "options": {}})
            elif isinstance(item, dict) and len(item) == 1 and "name" not in item:
                (name, options), = item.items()
                steps.append({"name": name, "options": options or {}})
            else:
                steps.append(item)
        return steps

    def to_dict(self) -> dict:
        data = self.model_dump()
        data["passes"] = [step.to_yaml_obj() for step in self.passes]
        if data.get("shape_search") is None:  # recipes without one dump (and fingerprint) as before
            data.pop("shape_search", None)
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def with_step_options(self, name: str, changes: dict[str, Any]) -> Recipe:
        """This recipe with step ``name``'s options updated, checked by that pass's options model; the other
        steps and settings are kept as they are."""
        steps = []
        for step in self.passes:
            if step.name == name:
                options = {**step.options, **changes}
                validate_options(name, options, f"{self.name}: {name}")
                step = step.model_copy(update={"options": options})
            steps.append(step)
        return self.model_copy(update={"passes": steps})

    def with_evaluation(self, **changes) -> Recipe:
        """This recipe with evaluation settings changed (checked by EvaluationSettings)."""
        evaluation = EvaluationSettings.model_validate({**self.evaluation.model_dump(), **changes})
        return self.model_copy(update={"evaluation": evaluation})

    def without_step(self, name: str) -> Recipe:
        """This recipe without step ``name`` (a pretrained student replaces the shaping step's model)."""
        return self.model_copy(update={"passes": [step for step in self.passes if step.name != name]})

    def without_shape_search(self) -> Recipe:
        return self.model_copy(update={"shape_search": None})


def _line_index(text: str) -> dict[tuple, int]:
    """Map each YAML path (keys and list indices) to its 1-based line, for error messages."""
    lines: dict[tuple, int] = {}

    def walk(node, path):
        lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key, val in node.value:
                lines[path + (key.value,)] = key.start_mark.line + 1
                walk(val, path + (key.value,))
                lines[path + (key.value,)] = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, val in enumerate(node.value):
                walk(val, path + (i,))

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    if root is not None:
        walk(root, ())
    return lines


def _where(lines: dict[tuple, int], path: tuple, origin: str) -> str:
    for cut in range(len(path), -1, -1):  # nearest enclosing node that has a line
        if path[:cut] in lines:
            return f"{origin}:{lines[path[:cut]]}"
    return origin


def _yaml_path(loc: tuple, raw: dict) -> tuple:
    """pydantic's loc for passes is (passes, i, options, key); YAML has (passes, i, name, key)."""
    if len(loc) >= 2 and loc[0] == "passes" and isinstance(loc[1], int):
        steps = raw.get("passes") or []
        item = steps[loc[1]] if loc[1] < len(steps) else None
        if isinstance(item, dict) and len(item) == 1:
            name = next(iter(item))
            rest = tuple(p for p in loc[2:] if p != "options")
            return ("passes", loc[1], name, *rest)
    return loc


def validate(raw: Any, origin: str = "<recipe>", text: str = "") -> Recipe:
    """Validate a parsed recipe: schema, then each pass's options, then the ordering contract."""
    lines = _line_index(text) if text else {}
    if not isinstance(raw, dict):
        raise InputError(f"{origin}: a recipe is a YAML mapping with a 'passes' list; see `xformopt recipes show default`")
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        path = _yaml_path(tuple(err["loc"]), raw)
        field = ".".join(str(p) for p in path) or "recipe"
        raise InputError(f"{_where(lines, path, origin)}: {field}: {err['msg']}") from None

    for i, step in enumerate(recipe.passes):
        path = ("passes", i, step.name)
        if step.name not in REGISTRY:
            raise InputError(
                f"{_where(lines, path, origin)}: unknown pass {step.name!r}; known passes: {', '.join(REGISTRY)}"
            )
        step.options = validate_options(step.name, step.options, origin, lines, path).model_dump()
    check_order(recipe, lines, origin)
    if recipe.shape_search is not None:
        check_shape_search(recipe, lines, origin)
    names = [step.name for step in recipe.passes]
    for i, name in enumerate(names):
        if name in names[:i]:  # after check_order, which gives the specific reason where there is one
            raise InputError(
                f"{_where(lines, ('passes', i, name), origin)}: pass {name!r} appears twice; each pass runs once "
                "per recipe (the report has one stage per pass): merge the two steps"
            )
    return recipe


def shaped_step(recipe: Recipe) -> PassStep | None:
    """The step whose options set the model's shape (the pass declares ``shape_options``)."""
    return next((step for step in recipe.passes if get_pass(step.name).shape_options), None)


def timed_step(recipe: Recipe) -> PassStep | None:
    """The step whose run time a shape search sets per shape (the pass declares ``minutes_option``)."""
    return next((step for step in recipe.passes if get_pass(step.name).minutes_option), None)


def student_step(recipe: Recipe) -> PassStep | None:
    """The step that takes a pretrained student (the pass declares ``student_option``)."""
    return next((step for step in recipe.passes if get_pass(step.name).student_option), None)


def _check_student_choice(recipe: Recipe, shape: ShapeChoice, where: str, i: int) -> None:
    """A ``student:`` entry names no shape, and the recipe has a pass that takes a pretrained student."""
    shaped = {k for k, v in shape.model_dump().items() if v is not None and k not in ("distill_minutes", "student")}
    if shaped:
        raise InputError(f"{where}: shape_search.shapes.{i}: a pretrained student is not pruned; give student or "
                         f"{', '.join(sorted(shaped))}, not both")
    if student_step(recipe) is None:
        takers = " or ".join(p.name for p in all_passes() if p.student_option)
        raise InputError(f"{where}: shape_search.shapes.{i}.student: the recipe has no {takers} pass to train it")


def check_shape_search(recipe: Recipe, lines: dict, origin: str) -> None:
    """Each shape is a valid explicit shape for this recipe's shaping step (which must exist), or a pretrained
    student a step of the recipe can train."""
    shaped, timed = shaped_step(recipe), timed_step(recipe)
    if shaped is None:
        shapers = " or ".join(p.name for p in all_passes() if p.shape_options)
        raise InputError(f"{_where(lines, ('shape_search',), origin)}: shape_search: chooses the model's shape, and "
                         f"the recipe has no {shapers} pass; add one or drop shape_search")
    owner = get_pass(shaped.name)
    for i, shape in enumerate(recipe.shape_search.shapes):
        given = {k: v for k, v in shape.model_dump().items() if v is not None and k != "distill_minutes"}
        path = ("shape_search", "shapes", i)
        if shape.student is not None:
            _check_student_choice(recipe, shape, _where(lines, path, origin), i)
            continue
        if not given:
            raise InputError(f"{_where(lines, path, origin)}: shape_search.shapes.{i}: give "
                             f"{', '.join(owner.shape_options[:-1])} and/or {owner.shape_options[-1]}")
        if shape.distill_minutes is not None and timed is None:
            raise InputError(f"{_where(lines, path, origin)}: shape_search.shapes.{i}.distill_minutes: the recipe has "
                             "no distill pass")
        explicit = {k: v for k, v in shaped.options.items() if k not in owner.shape_options + owner.shape_replaces}
        validate_options(shaped.name, {**explicit, **given}, origin, lines, path)


def validate_options(name: str, options: Any, origin: str, lines: dict | None = None, path: tuple = ()):
    """A pass's options through its own pydantic model; errors name the line and the field."""
    try:
        return get_pass(name).Options.model_validate(options)
    except ValidationError as exc:
        err = exc.errors()[0]
        sub = path + tuple(err["loc"])
        field = ".".join(str(p) for p in sub) or name
        raise InputError(f"{_where(lines or {}, sub, origin)}: {field}: {err['msg']}") from None


def check_order(recipe: Recipe, lines: dict[tuple, int] | None = None, origin: str = "<recipe>", start: str = "hf") -> None:
    """Each pass must consume what the previous one produced, and may forbid certain predecessors.

    A recipe starts from a Hugging Face (PyTorch) model; a single-pass command from its input's kind."""
    lines = lines or {}
    kind = start
    seen: list[str] = []
    for i, step in enumerate(recipe.passes):
        cls = get_pass(step.name)
        where = _where(lines, ("passes", i, step.name), origin)
        if cls.consumes != kind:
            before = f"after {seen[-1]!r}" if seen else "first"
            stage = "a PyTorch model" if cls.consumes == "hf" else "an ONNX model"
            raise InputError(
                f"{where}: pass {step.name!r} cannot run {before}: it needs {stage} "
                f"({cls.stage} stage); torch passes (prune, distill) go before export, onnx passes after it"
            )
        for earlier in seen:
            if earlier in cls.must_not_follow:
                raise InputError(
                    f"{where}: pass {step.name!r} cannot run after {earlier!r}: {cls.must_not_follow[earlier]}"
                )
        shaped_before = [e for e in seen if get_pass(e).stage == "torch"]
        if cls.student_option and step.options.get(cls.student_option) and shaped_before:
            raise InputError(f"{where}: {step.name}.{cls.student_option}: a pretrained student replaces the model, so "
                             f"what {', '.join(shaped_before)} made of it would be thrown away; drop "
                             f"{'that step' if len(shaped_before) == 1 else 'those steps'} or the {cls.student_option}")
        kind = cls.produces
        seen.append(step.name)


def load(path_or_name: str) -> Recipe:
    """A recipe from a YAML path, or a shipped recipe by name (``default``, ``fp32-fused``, ...)."""
    path = Path(path_or_name)
    if not path.is_file():
        shipped = RECIPES_DIR / f"{path_or_name}.yaml"
        if not shipped.is_file():
            raise InputError(
                f"recipe not found: {path_or_name} (not a file, and not a shipped recipe: {', '.join(shipped_names())})"
            )
        path = shipped
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}); save the recipe as UTF-8 YAML") from None
    except OSError as exc:
        raise InputError(f"cannot read recipe {path} ({exc.strerror or type(exc).__name__})") from None
    if len(text) > MAX_RECIPE_CHARS:
        raise InputError(f"{path}: {len(text)} characters is not a recipe (at most {MAX_RECIPE_CHARS}); "
                         "pass the recipe YAML file")
    try:
        refuse_aliases(text)
        raw = safe_yaml.load(text)
    except safe_yaml.DuplicateKeyError as exc:
        raise InputError(f"{path}:{exc.second_line}: {exc.problem} in the recipe") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{path}{line}: broken YAML: {problem}; fix the recipe file") from None
    except RecursionError:  # e.g. 5000 nested flow lists: the YAML composer recurses per level
        raise InputError(f"{path}: nested too deeply to be a recipe; fix the recipe file") from None
    refuse_nul(raw, str(path))
    return validate(raw, str(path), text)


def refuse_nul(raw, origin: str) -> None:
    """A "\\0" escape puts a NUL in a string; as a path it fails deep inside os calls (ValueError)."""
    stack = [raw]
    while stack:  # iterative: the tree may be as deep as YAML allowed
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and "\x00" in item:
            shown = item.replace("\x00", "\\0")[:80]
            raise InputError(f"{origin}: the value {shown!r} holds a NUL character; remove it from the recipe")


MAX_RECIPE_CHARS = 1_000_000


def refuse_aliases(text: str, origin: str = "") -> None:
    """YAML anchors and aliases (``&a`` / ``*a``) are refused: a recipe has no use for them, and
    nested aliases expand exponentially (the "billion laughs" document) in every later walk of the
    parsed tree, which would hang the run. Scanning events is linear in the text and expands nothing."""
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        anchor = getattr(event, "anchor", None)
        if isinstance(event, yaml.AliasEvent) or anchor:
            mark = event.start_mark
            raise yaml.MarkedYAMLError(problem="anchors and aliases (&name / *name) are not allowed in a recipe; "
                                               "write the values out", problem_mark=mark)


def shipped_names() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def override_flags() -> dict[str, list[str]]:
    """Every setting a pass reads from the command line (``Pass.flags``) -> the passes that read it,
    in registry order: what `xformopt optimize` and ``xformopt.optimize()`` may set in any recipe."""
    readers: dict[str, list[str]] = {}
    for cls in all_passes():
        for flag in cls.flags:
            readers.setdefault(flag, []).append(cls.name)
    return readers


def apply_overrides(recipe: Recipe, overrides: dict[str, Any], origin: str = "<command line>") -> Recipe:
    """Set each flag's options on every pass of ``recipe`` that declares the flag (``Pass.flags``); a flag
    that no pass would read is an error (it would silently do nothing)."""
    raw = recipe.to_dict()
    steps = [(get_pass(name), options) for name, options in (next(iter(step.items())) for step in raw["passes"])]
    given = {flag: value for flag, value in overrides.items() if value is not None}
    known = override_flags()
    for flag, value in given.items():
        if flag not in known:
            raise InputError(f"unknown setting {flag!r}; choose from {', '.join(known)}")
        for cls, options in steps:
            if flag in cls.flags:
                options[cls.flags[flag]] = value
    for flag in given:
        if not any(flag in cls.flags and cls.reads(cls.flags[flag], options) for cls, options in steps):
            readers = [get_pass(name) for name in known[flag]]
            when = "".join(f"; {cls.name} reads {cls.flags[flag]} only {cls.read_when[cls.flags[flag]]}"
                           for cls in readers if cls.flags[flag] in cls.read_when)
            raise InputError(f"--{flag.replace('_', '-')}: no pass of recipe {recipe.name!r} reads it (it feeds "
                             f"{', '.join(known[flag])}{when}); drop the flag or pick a recipe that uses it "
                             "(`xformopt recipes list`)")
    return validate(raw, origin)
