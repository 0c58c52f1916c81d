"""Recommendation API: top-K items for a user vector over the latest federated model."""
