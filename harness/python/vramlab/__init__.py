"""vramlab's Python side: phase marks for PyTorch programs, and the emulated GPU's boot.

    import vramlab
    with vramlab.phase("forward"):
        loss = model(**batch).loss

Each phase records PyTorch's own allocator statistics: the baseline, peak and end of
``torch.cuda.memory_allocated`` and ``memory_reserved``. Under ``vramlab emulate`` the rows go to
the emulator's report (and from there to the table, ``--json`` and ``--out`` rows in vramlab's CSV
schema); on a real GPU, :class:`Recorder` keeps them for the program to read or write.

``vramlab.estimate(model=..., gpu=..., **flags)`` runs ``vramlab estimate --json`` and returns a
typed :class:`Estimate` (the breakdown, the figures, the verdict, the emulated column when
``emulate=`` asks for it).
Phase names are vramlab's phase vocabulary (``load``, ``forward``, ``backward``, ``optimizer``,
``step_total``, ``prefill``, ``decode``, ``text_encode``, ``denoise``, ``vae_decode``, ...).
"""

from ._estimate import Estimate, Row, estimate
from .phase import Recorder, Span, phase, recorder

__all__ = ["Estimate", "Recorder", "Row", "Span", "estimate", "phase", "recorder"]
