"""Measurement: models side by side in one process, and the statistics of a paired speedup.

* :mod:`.bench`: ``bench_models`` (interleaved rounds, ratios against the first model);
* :mod:`.flops`: exact FLOP counts of one forward pass;
* :mod:`.memory`: weights and activation peak of one forward pass;
* :mod:`.stats`: the bootstrap interval of a paired speedup.
"""
