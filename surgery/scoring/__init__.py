"""Scoring and selection of units (heads, FFN neurons) that methods share.

* :mod:`.importance`: data-driven importance of the input features of Linear layers;
* :mod:`.selection`: the lowest units per layer or globally, from those scores.
"""
