"""Hugging Face Hub downloads into its own cache: what to fetch, resumable verified transfers, tokenizer checks."""
