"""ncclshim package."""
