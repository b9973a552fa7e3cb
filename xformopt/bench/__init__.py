"""`xformopt bench`: measure an artifact (measure.py), compare it with a baseline (gate.py), one run
of both (run.py). Calling the package, ``xformopt.bench(artifact, ...)``, is ``xformopt.api.bench``."""

from xformopt import _callable_package

_callable_package(__name__)
