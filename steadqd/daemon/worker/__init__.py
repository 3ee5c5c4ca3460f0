"""The worker role: a job from its claim to its settlement (see role.py)."""
