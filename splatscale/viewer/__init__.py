"""The web viewer (viser): a model's splats drawn in the browser, its scene's cameras,
exact renders on request, and a training run's progress and controls."""
