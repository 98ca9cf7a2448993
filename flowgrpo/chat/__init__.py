"""Text in and out of the policy: chat templates rendered to token ids, and actions parsed back.

- :mod:`~flowgrpo.chat.format`: messages to token ids, incrementally (token-in, token-out).
- :mod:`~flowgrpo.chat.parsing`: an action's text to tool calls and an answer.

May import: :mod:`flowgrpo.tool`, :mod:`flowgrpo.utils`, :mod:`flowgrpo.types`.
"""
