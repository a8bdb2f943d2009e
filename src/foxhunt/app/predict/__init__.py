"""A trained model's commands: `foxhunt predict`, `foxhunt export` and `foxhunt interpret`."""
