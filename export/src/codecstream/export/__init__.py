"""codecstream export-decoder and parity tools."""
