"""The sync engine: how a relaxed policy's decisions become parameter-server semantics over Horovod's allreduce.

``ticker`` is the data plane: a background thread issues ticks, each one Sum-allreduce of the updates the ranks
pushed since their last tick plus a metadata table (clocks, push and iteration times), so every rank receives the
same ticks in the same order. Its parts: ``table`` (the table, its codec and the pure functions of tables),
``row`` (this rank's row), ``pacing`` (probe, join and auto pacing), ``loop`` (the tick thread and one tick),
``wire`` (a tick's collectives), ``pool`` (the update buffers) and ``stream`` (streamed pushes).
``view`` is the global state every rank builds identically from that tick stream.
``engine`` (``SyncEngine``) is what a frontend calls once per training step: push this rank's update, pull (apply)
the completed ticks, and block at the gate while the policy says wait. ``updates`` holds the two update kinds
(gradients applied on a shared replica; model deltas of each rank's own copy), one class each. ``policies`` is the
glue from the engine's events to each policy's native decision rule (``hvd_elastic._native``); ``staleness``
measures, and optionally compensates, the staleness of every applied update. Framework-free (numpy only): the
frontends (``torch``, ``keras``, ``tensorflow``) supply the allreduce and apply the updates. Nothing is imported
here; import the modules.
"""
