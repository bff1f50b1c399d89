"""Foundation: user-facing errors and the config schema. Imports nothing else of ours."""
