"""Applying a scaling method to a transformers config and model."""
