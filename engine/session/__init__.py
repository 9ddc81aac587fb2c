"""A loaded target and drafter serving requests: plain text, chat, side by side, compare."""
