"""Model facts, apart from where models come from (xformopt/sources/): what a model is (spec.py) and how
a local folder loads (loading.py). runtime/ and everything that opens an artifact stand on this package
alone; only commands that take a MODEL argument (a path, alias, hub id or GGUF file) go through sources/."""

from xformopt.models.loading import load_tokenizer, load_torch_model, position_limit
from xformopt.models.spec import ModelSpec, artifact_task, check_text_model, describe, known_family, stage_spec

__all__ = ["ModelSpec", "artifact_task", "check_text_model", "describe", "known_family", "load_tokenizer",
           "load_torch_model", "position_limit", "stage_spec"]
