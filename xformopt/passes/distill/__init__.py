"""Knowledge distillation: the ``distill`` pass (``run``) and the small modules it wires up.

- ``losses``: the loss terms (soft-target KL with temperature, hard-label cross-entropy, embedding
  MSE and cosine, hidden-state and attention transfer through a layer map), each a plain function.
- ``student``: which model teaches, which learns, and how a layer-dropped student is cut from the teacher.
- ``data``: texts tokenized once, length-bucketed seeded batches, the teacher's outputs computed once.
- ``train``: the loop: schedule, time budget, evaluation, early stopping, best-checkpoint selection.
- ``checkpoint``: resumable state on disk (safetensors + ``torch.load(weights_only=True)`` + JSON).
- ``sets``: training and evaluation rows, kept apart from the reported ones; ``record``: loss definitions.
- ``qat``: the quantization-aware phase; ``relations``: MiniLM's relation heads; ``augment``, ``curve``.
"""
