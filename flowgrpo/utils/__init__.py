"""Small helpers with no knowledge of models or episodes: sync/async bridging, crash-safe files,
HTTP retries, stop signals, ``module:attr`` plugin specs, seeding, and the foreign config names of
other frameworks.

May import: :mod:`flowgrpo.types` and third-party packages only.
"""
