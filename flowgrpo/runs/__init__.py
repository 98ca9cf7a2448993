"""The run directory: what a run writes and everything that reads it back.

- :mod:`~flowgrpo.runs.store`: trajectories as append-only JSONL.
- :mod:`~flowgrpo.runs.metrics`, :mod:`~flowgrpo.runs.tracking`: per-step metrics, TensorBoard / W&B.
- :mod:`~flowgrpo.runs.checkpoint`: the policy and the training state on disk.
- :mod:`~flowgrpo.runs.records`: rewinding the records to the step a run resumes from.
- :mod:`~flowgrpo.runs.rundir`: the one typed reader of a run directory.
- :mod:`~flowgrpo.runs.evaluation`: held-out accuracy of a policy, paired between checkpoints.
- :mod:`~flowgrpo.runs.replay`, :mod:`~flowgrpo.runs.report`: a trajectory turn by turn; the HTML report.
- :mod:`~flowgrpo.runs.export`: a checkpoint as a plain Hugging Face model directory.

May import: :mod:`flowgrpo.components`, :mod:`flowgrpo.config` and every layer below them; never
:mod:`flowgrpo.gateway` or :mod:`flowgrpo.training`.
"""
