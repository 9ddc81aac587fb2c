"""Pure tensor functions on Tandem's hot path.

Each op has a pure-torch reference that is the specification; faster backends may sit beside it
and are chosen once at import. Nothing here knows about models, tokenizers or Qt.
"""
