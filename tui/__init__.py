"""The terminal UI (`pardiag tui`): a Textual app over an Analysis."""
