"""The prompt registry (versions, labels, experiments): later issues."""
