"""`xformopt search`: a Pareto front of recipes (accuracy on the validation split vs latency).

space.py (what may vary) -> sampler.py (Optuna proposes) -> trial.py (one pipeline run, scored on
the validation split) run by executors/ (local pool or Ray) -> front.py -> remeasure.py (serial,
interleaved latency on this host) -> outputs.py (search.json, pareto.png, search.md, best recipe).
run.py ties them together. The Python entry point is the function ``xformopt.search`` (``xformopt.api.search``).
"""
