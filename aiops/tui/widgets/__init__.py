"""Console widgets: one module per pane."""
