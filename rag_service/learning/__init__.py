"""The learning loop: prompt versions, experiments and promotion."""
