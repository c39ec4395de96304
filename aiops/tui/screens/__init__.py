"""Console screens: the main layout and the modals."""
