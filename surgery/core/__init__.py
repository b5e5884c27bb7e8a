"""The method contract and its run path: what every method is, and the one way a step is performed.

* :mod:`.api`: the entry verbs (``convert``, ``preview``, ``plan``, ``apply_plan``, ``inspect``);
* :mod:`.strategy`: ``Method`` (name, config, data need) and ``Strategy`` (one replayable step);
* :mod:`.run`: ``RunContext`` and ``perform_step``, the plan -> apply -> record (-> guard) path;
* :mod:`.pipeline`: ``Pipeline`` (recorded steps with training between) and ``PipelineSession``;
* :mod:`.guard`: accuracy before and after each structural step, recovery within a budget;
* :mod:`.manifest`: the recorded steps (``surgery.json``); :mod:`.report`: what a run returns;
* :mod:`.registry`: entry-point discovery of methods, adapters and commands;
* :mod:`.errors`: the one-line exceptions; :mod:`.progress`: progress events as data.

Nothing is imported here, so that ``surgery.core.errors`` stays as cheap as the command line needs.
"""
