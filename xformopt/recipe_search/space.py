"""A search space: YAML over recipe options, each key ``PASS.OPTION`` with a list of choices.

    name: encoder-quick
    recipe: default                  # base recipe (shipped name or YAML path) the choices edit
    choices:
      prune.sparsity: [0.3, 0.5]     # a pass absent from the base recipe is inserted in chain order
      prune.enabled: [false, true]   # PASS.enabled toggles a pass
      fuse.select: [fastest, none]
      quantize.mode: [dynamic, static]
    evaluation: {limit: 200, latency_rounds: 30, repeats: 2}   # each trial's own report (test rows)
    validation: {limit: 500}         # rows of the validation split the front is scored on

Validated like a recipe before any trial runs: every choice goes through its pass's options model,
and every combination (up to a cap) through the full recipe validation; errors name file, line and key.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from xformopt import recipe as recipes
from xformopt import safe_yaml
from xformopt.errors import InputError
from xformopt.passes import REGISTRY, get_pass

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
CHAIN = ("prune", "distill", "export", "fuse", "quantize")  # the ordering contract, as one list
TOP_KEYS = {"name", "description", "recipe", "choices", "evaluation", "validation"}
VALIDATION_KEYS = {"data", "limit", "seed", "text_column", "label_column"}
COMBINATIONS_CHECKED = 512  # beyond this, only each choice alone and the first combination


@dataclass
class SearchSpace:
    name: str
    origin: str
    base: recipes.Recipe
    choices: dict[str, list[Any]]
    evaluation: dict = field(default_factory=dict)
    validation: dict = field(default_factory=dict)
    description: str = ""

    def size(self) -> int:
        n = 1
        for values in self.choices.values():
            n *= len(values)
        return n

    def distinct_recipes(self) -> int:
        """How many different pass chains the choices make (a disabled pass's other keys collapse)."""
        seen = set()
        for combo in itertools.islice(itertools.product(*self.choices.values()), 100_000):
            seen.add(json.dumps(self._raw(dict(zip(self.choices, combo)), "x")["passes"], sort_keys=True, default=str))
        return len(seen)

    def recipe_for(self, params: dict[str, Any], name: str = "trial") -> recipes.Recipe:
        """The recipe one assignment of the choices gives (validated)."""
        return recipes.validate(self._raw(params, name), f"{self.origin} ({name})")

    def _raw(self, params: dict[str, Any], name: str) -> dict:
        base = self.base.to_dict()
        steps = {next(iter(s)): dict(next(iter(s.values()))) for s in base["passes"]}
        enabled = {p: True for p in steps}
        for key, value in params.items():
            pass_name, option = key.split(".", 1)
            if option == "enabled":
                enabled[pass_name] = bool(value)
                continue
            steps.setdefault(pass_name, {})[option] = value
            enabled.setdefault(pass_name, True)
        order = [p for p in CHAIN if p in steps] + [p for p in steps if p not in CHAIN]
        passes = [{p: steps[p]} for p in order if enabled.get(p, True)]
        evaluation = {**base["evaluation"], **self.evaluation}
        return {**base, "name": name, "passes": passes, "evaluation": evaluation,
                "description": f"search {self.name}: " + ", ".join(f"{k}={v}" for k, v in params.items())}

    def cheap_keys(self) -> list[str]:
        """Choice keys of passes that run on the ONNX graph (fuse, quantize): once a trial has paid for its
        torch passes (prune, distill), variants that differ only here reuse them from the pass cache."""
        return [k for k in self.choices if get_pass(k.split(".", 1)[0]).stage == "onnx"]

    def siblings(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Every other assignment of the cheap keys with the rest of ``params`` kept; none when the space
        has no expensive keys (then nothing is shared and the sampler should choose freely)."""
        cheap = self.cheap_keys()
        if not cheap or len(cheap) == len(self.choices):
            return []
        out = []
        for combo in itertools.product(*(self.choices[k] for k in cheap)):
            variant = {**params, **dict(zip(cheap, combo))}
            if variant != params:
                out.append(variant)
        return out

    def fingerprint(self) -> str:
        """What a resumed search must share with the interrupted one."""
        blob = json.dumps({"base": self.base.to_dict(), "choices": self.choices, "evaluation": self.evaluation,
                           "validation": self.validation}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return {"name": self.name, "origin": self.origin, "base_recipe": self.base.name, "choices": self.choices,
                "evaluation": self.evaluation, "validation": self.validation, "size": self.size()}


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def load(space: str | None = None, preset: str | None = None) -> SearchSpace:
    """A space from ``--space FILE`` or ``--preset NAME`` (exactly one; the default preset otherwise)."""
    if space and preset:
        raise InputError("give --space FILE or --preset NAME, not both")
    if space:
        path = Path(space)
        if not path.is_file():
            raise InputError(f"search space not found: {space} (give a YAML file, or --preset: {', '.join(preset_names())})")
    else:
        preset = preset or "encoder"
        path = PRESETS_DIR / f"{preset}.yaml"
        if not path.is_file():
            raise InputError(f"unknown preset {preset!r}; presets: {', '.join(preset_names())}")
    text = path.read_text()
    try:
        raw = safe_yaml.load(text)
    except safe_yaml.DuplicateKeyError as exc:
        raise InputError(f"{path}:{exc.second_line}: {exc.problem} in the search space") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise InputError(f"{path}{line}: broken YAML: {getattr(exc, 'problem', None) or exc}; fix the search space") from None
    return validate(raw, str(path), text)


def validate(raw: Any, origin: str = "<space>", text: str = "") -> SearchSpace:
    lines = recipes._line_index(text) if text else {}

    def fail(path: tuple, message: str):
        field_name = ".".join(str(p) for p in path) or "space"
        raise InputError(f"{recipes._where(lines, path, origin)}: {field_name}: {message}")

    if not isinstance(raw, dict):
        raise InputError(f"{origin}: a search space is a YAML mapping with a 'choices' mapping; see `xformopt search --help`")
    for key in raw:
        if key not in TOP_KEYS:
            fail((key,), f"unknown key; a search space has {', '.join(sorted(TOP_KEYS))}")
    choices = raw.get("choices")
    if not isinstance(choices, dict) or not choices:
        fail(("choices",), "a non-empty mapping of PASS.OPTION: [choice, ...] is required")
    base_name = str(raw.get("recipe") or "default")
    beside = Path(origin).parent / base_name  # a relative recipe path is read next to the space file
    if not Path(base_name).is_absolute() and beside.is_file():
        base_name = str(beside)
    try:
        base = recipes.load(base_name)
    except InputError as exc:
        fail(("recipe",), exc.message)
    base_steps = {s.name: s.options for s in base.passes}
    clean: dict[str, list] = {}
    for key, values in choices.items():
        path = ("choices", key)
        pass_name, _, option = str(key).partition(".")
        if not option:
            fail(path, "keys are PASS.OPTION, e.g. prune.sparsity or quantize.mode")
        if pass_name not in REGISTRY:
            fail(path, f"unknown pass {pass_name!r}; known passes: {', '.join(REGISTRY)}")
        fields = get_pass(pass_name).Options.model_fields
        if option != "enabled" and option not in fields:
            fail(path, f"pass {pass_name!r} has no option {option!r}; its options: enabled, {', '.join(fields)}")
        if not isinstance(values, list) or not values:
            fail(path, "give a non-empty list of choices, e.g. [0.3, 0.5]")
        for i, value in enumerate(values):
            if not (value is None or isinstance(value, (bool, int, float, str))):
                fail(path + (i,), f"choices are single values (number, string, true/false, null), got {value!r}")
            if option == "enabled":
                if not isinstance(value, bool):
                    fail(path + (i,), f"enabled takes true or false, got {value!r}")
                continue
            # this choice with the first choice of the pass's other keys: a pass absent from the base
            # recipe may need several keys together (prune needs a target)
            siblings = {k.partition(".")[2]: v[0] for k, v in choices.items()
                        if str(k).startswith(pass_name + ".") and isinstance(v, list) and v and not k.endswith(".enabled")}
            try:
                recipes.validate_options(pass_name, {**base_steps.get(pass_name, {}), **siblings, option: value}, origin)
            except InputError as exc:
                fail(path + (i,), exc.message.split(": ", 2)[-1].replace("Value error, ", ""))
        if len(set(map(repr, values))) != len(values):
            fail(path, "a choice is listed twice")
        clean[str(key)] = values
    evaluation = raw.get("evaluation") or {}
    try:
        recipes.EvaluationSettings.model_validate({**base.evaluation.model_dump(), **evaluation})
    except Exception as exc:  # pydantic ValidationError: first error, one line
        err = exc.errors()[0] if hasattr(exc, "errors") else {"loc": (), "msg": str(exc)}
        fail(("evaluation", *err["loc"]), err["msg"])
    validation = raw.get("validation") or {}
    if not isinstance(validation, dict):
        fail(("validation",), "a mapping (data, limit, seed, text_column, label_column)")
    for key in validation:
        if key not in VALIDATION_KEYS:
            fail(("validation", key), f"unknown key; validation takes {', '.join(sorted(VALIDATION_KEYS))}")
    if validation.get("limit") is not None and (not isinstance(validation["limit"], int) or validation["limit"] < 1):
        fail(("validation", "limit"), "a whole number >= 1")
    space = SearchSpace(str(raw.get("name") or Path(origin).stem), origin, base, clean, dict(evaluation), dict(validation),
                        str(raw.get("description") or ""))
    combos = itertools.product(*clean.values())
    for combo in itertools.islice(combos, COMBINATIONS_CHECKED):
        params = dict(zip(clean, combo))
        try:
            space.recipe_for(params)
        except InputError as exc:
            raise InputError(f"{origin}: choices {', '.join(f'{k}={v}' for k, v in params.items())} make a broken "
                             f"recipe: {exc.message.split(': ', 1)[-1]}") from None
    return space
