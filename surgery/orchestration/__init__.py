"""Orchestration: the entry verbs and the runs that chain steps, above every part of the library.

* :mod:`.api`: the entry verbs (``convert``, ``preview``, ``plan``, ``apply_plan``, ``inspect``);
* :mod:`.pipeline`: ``Pipeline`` (recorded steps with training between) and ``PipelineSession``;
* :mod:`.guard`: accuracy before and after each structural step, recovery within a budget;
* :mod:`.reference`: the original a chain of steps is held to (``--teacher``).

The base (:mod:`surgery.core`) holds the method contract these verbs run; this package may import
any part (anatomy, data, training, ...), and no part imports it.
"""
