"""kernel_db package."""
