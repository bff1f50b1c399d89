"""Hugging Face conversion: the declarative mapping table, the non-weight files, export/import/verify."""
