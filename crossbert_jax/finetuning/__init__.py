"""GLUE fine-tuning: ModernBERT's recipe, trials, the table, the classifier export (the finetune command)."""
