"""The base: the method contract and what every other package builds on; it knows no method and no training.

* :mod:`.strategy`: ``Method`` (name, config, data need) and ``Strategy`` (one replayable step);
* :mod:`.run`: ``RunContext`` and ``perform_step``, the plan -> apply -> record (-> guard) path;
* :mod:`.requirements`: what a method's data must look like (the declared data need);
* :mod:`.manifest`: the recorded steps (``surgery.json``); :mod:`.report`: what a run returns;
* :mod:`.registry`: entry-point discovery of methods, pipelines, adapters and commands;
* :mod:`.errors`: the one-line exceptions; :mod:`.progress`: progress events as data;
* :mod:`.distributed`: which process of a torchrun/accelerate launch this is.

The entry verbs and the guard live above the parts, in :mod:`surgery.orchestration`. Nothing is
imported here, so that ``surgery.core.errors`` stays as cheap as the command line needs.
"""
