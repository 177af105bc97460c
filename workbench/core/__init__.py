"""The measurement core: the knobs, the user's workload, the training step, the phases of a trial and what
they measure. Imports nothing else of the workbench."""
