"""Optuna proposes the trials: TPE or NSGA-II, single- or multi-objective, stored in DIR for --resume.

Optuna's ask/tell interface keeps the driver in charge of execution (a local pool or Ray tasks); the
study lives in a journal file in the search directory (``optuna.journal``), so an interrupted search
reopens it and asks only for the trials still missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xformopt.errors import InputError

OBJECTIVES = {"accuracy": "maximize", "latency": "minimize"}
SAMPLERS = ("tpe", "nsga2")
STUDY = "xformopt-search"


def require_optuna():
    try:
        import optuna
    except ImportError:
        raise InputError("xformopt search needs Optuna: pip install 'xformopt[search]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def parse_objectives(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in OBJECTIVES]
    if not names or bad or len(set(names)) != len(names):
        raise InputError(f"--objective {value!r}: give accuracy, latency or accuracy,latency")
    return names


def make_sampler(name: str, seed: int, multi: bool):
    optuna = require_optuna()
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "tpe":
        # constant_liar: trials still running count as pessimistic results, so parallel asks spread out.
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=10)
    raise InputError(f"--sampler {name!r}: choose {', '.join(SAMPLERS)}")


def open_study(directory: Path, sampler_name: str, seed: int, objectives: list[str], resume: bool):
    optuna = require_optuna()
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(directory / "optuna.journal")))
    sampler = make_sampler(sampler_name, seed, len(objectives) > 1)
    return optuna.create_study(
        study_name=STUDY, storage=storage, sampler=sampler, load_if_exists=resume,
        directions=[OBJECTIVES[o] for o in objectives],
    )


def propose(trial, choices: dict[str, list[Any]]) -> dict[str, Any]:
    """One value per key; Optuna's categorical distribution keeps the choices' own types."""
    return {key: trial.suggest_categorical(key, values) for key, values in choices.items()}


def values_for(result: dict, objectives: list[str]) -> list[float]:
    return [result["metric"] if o == "accuracy" else result["latency_ms"] for o in objectives]
