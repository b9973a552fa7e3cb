"""`xformopt bench`: measure an artifact (measure.py), compare it with a baseline (gate.py), one run
of both (run.py). The Python entry point is the function ``xformopt.bench`` (``xformopt.api.bench``)."""
