"""`dfo watch`: evaluate every new training checkpoint as it lands, and keep τ over training steps.

Pure parts (facts in, plan out): ``discovery`` (a listing of the training folder → checkpoints ordered by
step), ``selection`` (what is settled and not yet evaluated → what to do this round), ``measures``
(a run's headline metrics with bootstrap CIs, and the verdict against the previous best), ``series``
(the state and ``series.json`` model), ``render`` (series.md) and ``plot`` (tau_vs_step.png).
Side effects: ``probe`` (lists the folder on the training host), ``loop`` (relay → eval → pull → series
update, restartable), ``hooks`` (--on-result) and ``supervisor`` (--detach).
"""
