"""`xformopt serve`: an artifact behind an HTTP endpoint (routes per task, dynamic batching, result and
tokenization caches, Prometheus metrics), on uvicorn or as a Ray Serve deployment (``ray_serve``)."""
